for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
# build 8f1046b: the matmul test binary, then the full check
timeout 100 .bench/n2/matmul-test --test-threads 4 > $OUT/tests.txt 2>&1
(time timeout 280 .bench/n2/check) > $OUT/check.txt 2>&1
