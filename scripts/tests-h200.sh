#!/usr/bin/env bash
# Run the test binaries packed by scripts/tests-pack.sh on an H200 machine (Vulkan loader from
# .gl/*.deb, as scripts/bench-h200.sh), from the repository root. One line a binary goes to
# $OUT/summary.txt, and every binary's output, packed, to $OUT/tests.tgz (tests-NAME.txt: the
# device tool returns a limited number of files from $OUT); ONLY="a b" runs those binaries,
# TEST_TIMEOUT (default 300) bounds each. Exits nonzero when any binary fails.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
LOGS=$(mktemp -d)
failed=0
for t in ${ONLY:-$(ls /tmp/tb)}; do
  start=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" "/tmp/tb/$t" > "$LOGS/tests-$t.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed=1
  echo "$t rc=$rc $(( $(date +%s) - start ))s $(grep -h 'test result' "$LOGS/tests-$t.txt" | tail -1)"
  grep -h '^test .* FAILED$' "$LOGS/tests-$t.txt"
done | tee "$OUT/summary.txt"
tar -C "$LOGS" -czf "$OUT/tests.tgz" .
grep -q ' rc=[1-9]' "$OUT/summary.txt" && exit 1
exit $failed
