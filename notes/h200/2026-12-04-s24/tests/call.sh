#!/usr/bin/env bash
# Every test binary of b060ac3 on the H200 but the operator-check binary (its operator checks
# of the changed families ran with the check example in blocks/ and verify/).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
ALL=$(tar -tJf .bench/tests.tar.xz | sed 's#tb/##' | grep -v -e '^$' -e '^check$' | tr '\n' ' ')
ONLY="$ALL" TEST_TIMEOUT=200 OUT=$OUT/t1 bash scripts/tests-h200.sh > /dev/null 2>&1; cat $OUT/t1/summary.txt
