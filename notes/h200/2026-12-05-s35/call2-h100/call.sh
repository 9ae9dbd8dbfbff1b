# An H100 (the H200 refused); old = 6e73a08 (the chunked kernels of the call before), new = 4632a31 (its kernels those of 3fc2168:
# (rows staged in workgroup memory, 16 columns a workgroup, register-blocked chunk_grads products,
# the solves side by side, per-row dots four lanes a row; 4632a31 adds DeltaAlgorithm::Auto). Same call, same card.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
timeout 100 .bench/gated_delta > $OUT/tests.txt 2>&1
for b in new old; do B=./target/release/examples/bench; [ $b = old ] && B=.bench/bench_old
  timeout 150 $B --profile --only gated_delta_chunked > $OUT/profile-$b.txt 2>&1; done
