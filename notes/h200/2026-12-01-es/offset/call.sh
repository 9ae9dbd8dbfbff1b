set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
ONLY="rms_norm,layer_norm,add_rms_norm,softmax_backward"
one() { timeout 150 $1 --json /tmp/n-$2-$3.json --only $ONLY > /tmp/n-$2-$3.txt 2>&1; grep "median" /tmp/n-$2-$3.txt | sed "s/^/$2 r$3 /"; }
{ for r in 1 2; do one target/release/examples/bench main $r; one .bench/bench-exp exp $r; done; } > $OUT/ab-exp.txt
cp /tmp/n-exp-1.txt $OUT/bench-exp.txt; cp /tmp/n-main-1.txt $OUT/bench-main.txt
wc -l $OUT/ab-exp.txt
