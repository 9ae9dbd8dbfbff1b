#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for i in 1 2; do
  for b in base new; do
    timeout 100 .bench/$b/bench --only cross_entropy_in_place > "$OUT/bench-$b-$i.txt" 2>&1
    echo "== $b $i rc=$?"; grep -E "^cross_entropy_in_place|in_place.*peak" "$OUT/bench-$b-$i.txt"
  done
done
WGRAD_IN_PLACE_ROWS=2048 timeout 100 .bench/new/bench --only cross_entropy_in_place > "$OUT/bench-new-r2048.txt" 2>&1
echo "== new r2048 rc=$?"; grep -E "^cross_entropy_in_place|in_place.*peak" "$OUT/bench-new-r2048.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=ce PYTHONPATH=/tmp/site timeout 120 python3 .peers/peers.py > "$OUT/peers.txt" 2>&1
tail -5 "$OUT/peers.txt"
cd "$OUT" && tar czf all.tgz *.txt *.jsonl 2>/dev/null; rm -f bench-*.txt
