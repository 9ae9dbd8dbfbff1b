set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=target/release/examples/bench
ONLY=rms_norm,layer_norm,add_rms_norm,softmax,log_softmax
one() { if [ $1 = trees ]; then export WGRAD_SUBGROUP_ROWS=0; else unset WGRAD_SUBGROUP_ROWS; fi
  timeout 150 $B --json /tmp/n-$1-$2.json --only $ONLY > /tmp/n-$1-$2.txt 2>&1; grep "median" /tmp/n-$1-$2.txt | sed "s/^/$1 r$2 /"; }
{ one rule 1; one trees 1; one rule 2; } > $OUT/ab.txt
cp /tmp/n-rule-1.txt $OUT/bench-rule.txt; cp /tmp/n-rule-1.json $OUT/bench-rule.json; cp /tmp/n-trees-1.txt $OUT/bench-trees.txt
unset WGRAD_SUBGROUP_ROWS
timeout 150 target/release/examples/check > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -3 $OUT/check.txt; grep -E "FAIL|ERROR" $OUT/check.txt | head
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/site SECTIONS=norm,softmax timeout 150 python3 .peers/peers.py > $OUT/peers.txt 2>&1
rm -f $OUT/peers.json $OUT/peers.jsonl
grep -E "softmax" $OUT/peers.txt | grep -E "liger|torch" | head -20
