set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=target/release/examples/bench
ONLY=rms_norm,layer_norm,add_rms_norm,softmax,log_softmax
one() { if [ $1 = sg ]; then export WGRAD_SUBGROUP_ROWS=1; else unset WGRAD_SUBGROUP_ROWS; fi
  timeout 150 $B --json /tmp/n-$1-$2.json --only $ONLY > /tmp/n-$1-$2.txt 2>&1; grep "median" /tmp/n-$1-$2.txt | sed "s/^/$1 r$2 /"; }
{ for r in 1 2; do one tree $r; one sg $r; done; } > $OUT/ab-sg.txt
cp /tmp/n-tree-1.txt $OUT/bench-tree.txt; cp /tmp/n-sg-1.txt $OUT/bench-sg.txt; cp /tmp/n-tree-1.json $OUT/bench-tree.json; cp /tmp/n-sg-1.json $OUT/bench-sg.json
unset WGRAD_SUBGROUP_ROWS
timeout 150 target/release/examples/check > $OUT/check.txt 2>&1; echo "check rc=$?"; grep -c PASS $OUT/check.txt; grep -E "FAIL|ERROR" $OUT/check.txt | head
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/site SECTIONS=norm,softmax timeout 150 python3 .peers/peers.py > $OUT/peers.txt 2>&1
rm -f $OUT/peers.json $OUT/peers.jsonl
sort -k3 $OUT/ab-sg.txt | awk '{print $1, $2, $3, $4, $5, $6, $NF}' | head -200; tail -30 $OUT/peers.txt
