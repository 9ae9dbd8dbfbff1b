set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for r in 1 2; do
  for v in p0 v2 v5; do
    timeout 100 .bench/$v/bench --only "matmul_fwd_tc,tc_probe" > /tmp/$v-$r.txt 2>&1
    grep -E "TFLOP|rror" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
