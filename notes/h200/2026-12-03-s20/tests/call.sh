#!/usr/bin/env bash
# Every test binary of a6395c4 on the H200, the operator-check binary last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
ALL=$(tar -tJf .bench/tests.tar.xz | sed 's#tb/##' | grep -v -e '^$' -e '^check$' | tr '\n' ' ')
ONLY="$ALL" TEST_TIMEOUT=150 OUT=$OUT/t1 bash scripts/tests-h200.sh > /dev/null 2>&1; cat $OUT/t1/summary.txt
ONLY=check TEST_TIMEOUT=380 OUT=$OUT/t2 bash scripts/tests-h200.sh > /dev/null 2>&1; cat $OUT/t2/summary.txt
tar -C $OUT -czf $OUT/all.tgz t1 t2 && rm -rf $OUT/t1 $OUT/t2
