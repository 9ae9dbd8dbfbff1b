set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
D=.bench/s12
run() { WGRAD_SMX_VAR=$2 timeout 60 $1 --only "softmax" > /tmp/o.txt 2>&1; grep -E "^softmax .*bf16" /tmp/o.txt | sed "s/^/$3 /"; }
for r in 1 2; do
  run $D/bench-var 0 "base r$r"
  run $D/bench-k2 6 "split-no-min r$r"
  run $D/bench-k2 7 "ties-away r$r"
  if [ $r = 1 ]; then run $D/bench-k2 0 "split-with-min r$r"; run $D/bench-k2 8 "nearest(k2 build) r$r"; fi
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
