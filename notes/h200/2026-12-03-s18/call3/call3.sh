# Session 18, call 3 (build 86d7eba): the engine test binary 8 times in parallel mode (stacks on
# a hang), then every test binary but check twice, default (parallel) threads.
set -uo pipefail
BINS=engine3 RUNS=8 bash .dbg/hang.sh 2>&1 | tee $OUT/hang.txt
for r in 1 2; do
  ONLY="$(tar tJf .bench/tests.tar.xz | sed -n 's#^tb/##p' | grep -v '^check$' | grep -v '^$' | tr '\n' ' ')" TEST_TIMEOUT=100 OUT=$OUT/run$r bash scripts/tests-h200.sh > /dev/null 2>&1
  echo "== suite run $r"; cat $OUT/run$r/summary.txt
done
