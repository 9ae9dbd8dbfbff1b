# Build 072a5d3 (.bench/s32): the new operators' checks and test binaries (expression VJPs,
# multi-token attention, attention residuals, vocabulary-parallel cross-entropy) and the norm
# test binary; GroupNorm's per-channel affine loaded as one word (this build) against its
# 16-byte chunk (b5d9293, .bench/s31/bench), group_norm and layer_norm rows alternating twice;
# the new operators' rows beside rms_norm's; the peers (Liger 0.8.5, PyTorch eager) of
# multi-token attention and attention residuals.
. .bench/head.sh
echo "== check of the new operators" >> $R
timeout 120 .bench/s32/check expression_vjp,multi_token_attention,attn_res,vocab_parallel_cross_entropy > /tmp/c.txt 2>&1
echo "rc=$?" >> $R; grep -E "PASS|FAIL|passed" /tmp/c.txt >> $R
for t in expr mta attn_res vocab_parallel; do
  echo "== $t tests" >> $R
  timeout 150 .bench/s32/$t > /tmp/t.txt 2>&1; echo "rc=$?" >> $R
  grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R; cp /tmp/t.txt $OUT/tests-$t.txt
done
for run in 1 2; do
  for b in s31 s32; do
    echo "== group_norm, $b, run $run" >> $R
    timeout 100 .bench/$b/bench --only group_norm,layer_norm > /tmp/o.txt 2>&1
    echo "rc=$?" >> $R; grep -E "^(group|layer|copy)" /tmp/o.txt >> $R; cp /tmp/o.txt $OUT/rows-$b-$run.txt
  done
done
echo "== new rows" >> $R
timeout 150 .bench/s32/bench --only expr,rms_norm,mta,attn_res,vocab_parallel > /tmp/o.txt 2>&1
echo "rc=$?" >> $R; grep -E "^(expr|rms|mta|attn|vocab|copy)" /tmp/o.txt >> $R; cp /tmp/o.txt $OUT/new-rows.txt
echo "== peers mta, attn_res" >> $R
PYTHONPATH=/tmp/site SECTIONS=mta,attn_res OUT=$OUT timeout 150 python3 .peers/peers.py > /tmp/p.txt 2>&1
echo "rc=$?" >> $R; grep -v "^  " /tmp/p.txt >> $R
cat $R
