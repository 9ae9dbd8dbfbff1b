# bench_old = 81b1a3a; bench_new = no per-tap divisions (../mta); bench_new2 = + row windows of four
# outputs in conv_forward / conv_input_grad and tap rows in conv_param_partials (same bits on lavapipe)
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
timeout 60 .bench/mta_tests > $OUT/tests.txt 2>&1
for r in 1 2; do for b in old new new2; do
  timeout 60 .bench/bench_$b --profile --only mta > $OUT/$b-$r.txt 2>&1
done; done
