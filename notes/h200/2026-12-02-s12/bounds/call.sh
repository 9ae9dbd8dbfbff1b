set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s12/bench-var
for r in 1 2; do
  for v in 0 1 2 3 4 5; do
    WGRAD_SMX_VAR=$v timeout 120 $B --only "softmax,softmax_backward_as,softmax_backward_from_output" > /tmp/$v-$r.txt 2>&1
    grep -iE "^softmax.*bf16|rror|copy" /tmp/$v-$r.txt | sed "s/^/v$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
