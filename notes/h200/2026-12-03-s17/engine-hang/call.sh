# The engine test binary of build s17d ran past 60 s on the H200 (3 s at 146dfad): run its
# tests one at a time, the new engine_builds_and_reports_info first, to find the one that
# does not finish.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s17d
timeout 40 $B/engine engine_builds_and_reports_info --test-threads=1 --nocapture > $OUT/first.txt 2>&1; echo "first rc=$?"
tail -5 $OUT/first.txt
timeout 100 $B/engine --test-threads=1 > $OUT/all.txt 2>&1; echo "all rc=$?"
tail -25 $OUT/all.txt
