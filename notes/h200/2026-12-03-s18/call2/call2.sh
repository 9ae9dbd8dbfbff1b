# Session 18, call 2: (1) the engine test binary with shared devices, 12 parallel runs (stacks on
# a hang); (2) JSD/KL/TVD bench: base (HEAD 44a5bca) vs two chunks a step in div_rows_v,
# alternating twice; (3) every test binary but check, default (parallel) threads.
set -uo pipefail
R=$(pwd)
BINS=engine2 RUNS=12 bash .dbg/hang.sh 2>&1 | tee $OUT/hang.txt
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for r in 1 2; do
  for b in s18base s18jsd; do
    echo "== $b run $r" >> $OUT/ab.txt
    .bench/$b/bench --only jsd,kl_div,tvd >> $OUT/ab.txt 2>/dev/null
  done
done
grep -E "^== |^(jsd|kl_div|tvd)" $OUT/ab.txt | grep -E "== |bf16|f32" | head -80
ONLY="$(tar tJf .bench/tests.tar.xz | sed -n 's#^tb/##p' | grep -v '^check$' | grep -v '^$' | tr '\n' ' ')" TEST_TIMEOUT=100 bash scripts/tests-h200.sh
