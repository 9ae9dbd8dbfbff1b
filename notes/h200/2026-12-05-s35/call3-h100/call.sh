# An H100 (the H200 refused). new = c68c48e (rows fetched a round ahead in chunk_states / chunk_dstate,
# chunk_pdo, the solves' right sides loaded first, chunk_grads's tile products fetching a step ahead
# with one accumulator block live), mid = 3fc2168 (the kernels of call2), old = 6e73a08. Same call, same card.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
timeout 60 .bench/gated_delta > $OUT/tests.txt 2>&1
timeout 200 ./target/release/examples/bench --profile --json $OUT/bench-new.json --only gated_delta > $OUT/profile-new.txt 2>&1
for b in mid old; do timeout 80 .bench/bench_$b --profile --only gated_delta_chunked > $OUT/profile-$b.txt 2>&1; done
