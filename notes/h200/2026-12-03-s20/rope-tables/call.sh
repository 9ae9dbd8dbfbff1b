#!/usr/bin/env bash
# RoPE step kernels: tables read 16 bytes a load ("cand") against a9fcce2 ("new", one word a
# load), and a bound ("bound": a9fcce2 with no table loads at all, wrong values); alternating
# twice. The candidate's rope test binary first.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/b"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 60 .bench/cand/rope-test > "$OUT/b/tests-rope.txt" 2>&1; echo "rope tests rc=$?"; grep "test result" "$OUT/b/tests-rope.txt"
for i in 1 2; do
  for b in new cand bound; do
    timeout 100 .bench/$b/bench --only rope > "$OUT/b/bench-$b-$i.txt" 2>&1
    echo "== $b $i rc=$?"; grep -E "^rope" "$OUT/b/bench-$b-$i.txt"
  done
done
tar -C $OUT -czf $OUT/all.tgz b && rm -rf $OUT/b
