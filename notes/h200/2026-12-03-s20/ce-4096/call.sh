#!/usr/bin/env bash
# In place by blocks of 4,096 rows without predictions (a6395c4) against 90533af ("base": 2,048
# rows, predictions, the partials in their own launch); then the peers' ce section.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
ONLY="loss fused_linear" TEST_TIMEOUT=200 OUT=$OUT/t bash scripts/tests-h200.sh > /dev/null 2>&1; cat $OUT/t/summary.txt
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
mkdir -p $OUT/b
run() { # label, binary, env...
  local label=$1 bin=$2; shift 2
  env "$@" timeout 120 .bench/$bin/bench --only cross_entropy > "$OUT/b/bench-$label.txt" 2>&1
  echo "== $label rc=$?"; grep -E "in_place.*(median|peak)|fwd_bwd_as .*bf16 .*median" "$OUT/b/bench-$label.txt"
}
for i in 1 2; do
  run "base-$i" base
  run "new-$i" new
done
run "new-r2048" new WGRAD_IN_PLACE_ROWS=2048
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=ce PYTHONPATH=/tmp/site timeout 200 python3 .peers/peers.py > $OUT/b/peers.txt 2>&1; tail -6 $OUT/b/peers.txt
cp $OUT/bench.json $OUT/b/ 2>/dev/null
tar -C $OUT -czf $OUT/all.tgz t b && rm -rf $OUT/t $OUT/b
