# bench_old = 81b1a3a, bench_new = the MTA backward without per-tap divisions (same bits on lavapipe)
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
for r in 1 2; do for b in old new; do
  timeout 60 .bench/bench_$b --profile --only mta > $OUT/$b-$r.txt 2>&1
done; done
