# The whole test suite with the BF16 conversion in hardware (after the RoPE suffix copies left
# the hook), outputs packed into one file; the failures' messages printed.
set -uo pipefail
mkdir -p /tmp/t
OUT=/tmp/t TEST_TIMEOUT=100 ONLY="norm loss rope reduce activation cast engine attention grpo preference fused_linear mlp embedding optim tensor gated_delta model matmul wgrad" bash scripts/tests-h200.sh > /dev/null 2>&1; echo "tests rc=$?"
cat /tmp/t/summary.txt
tar -C /tmp -czf $OUT/tests.tgz t
for f in /tmp/t/tests-*.txt; do grep -l "FAILED" $f > /dev/null && grep -h -B2 -A14 "panicked" $f | head -60; done
