# Not run (no device was lent in this session): the call that times what this session built.
# Carry [".gl", ".whl", ".peers", ".bench"] with .bench/s30/{bench,norm} the stripped release
# builds of HEAD (`cargo build --release --example bench`; the norm test binary from
# `cargo test --release --test norm --no-run --message-format=json`).
. .bench/head.sh
R=$OUT/results.txt
echo "== norm tests" >> $R
timeout 120 .bench/s30/norm > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
# Modulated RMSNorm's backward: the general passes (the rule) against the chunk passes
# (forced), alternating twice; the modulated rows are on the main shape (8192²).
for run in 1 2; do
  for forced in "" 1; do
    echo "== modulated, WGRAD_NORM_CHUNK_PASSES=$forced run $run" >> $R
    WGRAD_NORM_CHUNK_PASSES=$forced timeout 100 .bench/s30/bench --only modulated_rms_norm > /tmp/o.txt 2>&1
    echo "rc=$?" >> $R; grep -E "GB/s|^copy" /tmp/o.txt >> $R
  done
done
# The register forwards whose bindings changed (LayerNorm, GroupNorm, add+RMSNorm: the same
# code after specialization, fewer bindings) and GroupNorm's backward, against the README rows.
echo "== norm rows" >> $R
timeout 150 .bench/s30/bench --only layer_norm,add_rms_norm,group_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R
grep -E "GB/s|^copy" /tmp/o.txt >> $R
cat $R
