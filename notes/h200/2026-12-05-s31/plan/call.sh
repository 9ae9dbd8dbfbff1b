# Not run (no device was lent in this session): the call that checks and times what this
# session built; run it after `notes/h200/2026-12-04-s30/plan/call.sh` (the norm A/B).
# Carry [".gl", ".whl", ".peers", ".bench"] with .bench/s31/{bench,attention,dual_chunk,check}
# the stripped release builds of HEAD (`cargo build --release --example bench`; the test
# binaries from `cargo test --release --test attention --test dual_chunk --test check --no-run
# --message-format=json`).
. .bench/head.sh
R=$OUT/results.txt
# Attention's kernels now put their tiles into workgroup memory by column halves where the
# compact layout asks it (P_COLS 32); on the H200 the halves' loops run once. The tests first
# (the compact layout on a 16 KiB device, bit for bit the full tiles), then the README's
# attention rows (B4 H32 S2048 D128, B1 H16 S8192 D128) against their figures.
for t in attention dual_chunk; do
  echo "== $t tests" >> $R
  timeout 200 .bench/s31/$t > /tmp/t.txt 2>&1; echo "rc=$?" >> $R
  grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
done
echo "== check (default limits device, entry points)" >> $R
timeout 200 .bench/s31/check operator_checks_pass_on_a_device_with_webgpu_default_limits entry_points > /tmp/t.txt 2>&1
echo "rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
echo "== attention and dual chunk rows" >> $R
timeout 240 .bench/s31/bench --only attention_fwd,attention_fwd_bwd,dual_chunk > /tmp/o.txt 2>&1
echo "rc=$?" >> $R; grep -E "attention|dual_chunk|^copy" /tmp/o.txt >> $R
cat $R
