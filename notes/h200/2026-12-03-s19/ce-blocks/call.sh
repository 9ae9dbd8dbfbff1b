#!/usr/bin/env bash
# CE in place by blocks of rows: test binaries, then the CE bench (base c33f545 vs new, alternating), block sizes, peers.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt"
ONLY="$(tar -tJf .bench/tests.tar.xz | sed 's|tb/||' | grep -v '^$' | grep -v '^check$' | tr '\n' ' ')" TEST_TIMEOUT=150 OUT="$OUT" bash scripts/tests-h200.sh > "$OUT/tests-run.txt" 2>&1
echo "tests rc=$?"; cat "$OUT/summary.txt"
for i in 1 2; do
  for b in base new; do
    timeout 150 .bench/$b/bench --only cross_entropy --json "$OUT/bench-$b-$i.json" > "$OUT/bench-$b-$i.txt" 2>&1
    echo "$b $i rc=$?"; grep -E "in_place|cross_entropy " "$OUT/bench-$b-$i.txt" | grep -v "^ *$" | head -20
  done
done
for r in 1024 4096; do
  WGRAD_IN_PLACE_ROWS=$r timeout 150 .bench/new/bench --only cross_entropy_in_place > "$OUT/bench-rows$r.txt" 2>&1
  echo "rows $r rc=$?"; grep -E "in_place" "$OUT/bench-rows$r.txt" | head
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=ce PYTHONPATH=/tmp/site timeout 150 python3 .peers/peers.py > "$OUT/peers.txt" 2>&1
cat "$OUT/peers.txt" | tail -8
