# Build 1bfb5a4 (.bench/s32): the expression, multi-token attention and attention-residual test
# binaries (their output in one file); the multi-token attention and attention-residual rows
# (parameter partials per output row; the backward by columns over the blocks, 4 tokens a
# workgroup); the peers (Liger 0.8.5, PyTorch eager) of both.
. .bench/head.sh
for t in expr mta attn_res vocab_parallel; do
  echo "== $t tests" >> $R
  timeout 150 .bench/s32/$t > /tmp/t.txt 2>&1; echo "rc=$?" >> $R
  grep -E "test result|FAILED|panicked|differ|outside" /tmp/t.txt >> $R
done
echo "== rows" >> $R
timeout 150 .bench/s32/bench --only mta,attn_res,vocab_parallel > /tmp/o.txt 2>&1
echo "rc=$?" >> $R; grep -E "^(mta|attn|copy)" /tmp/o.txt >> $R
echo "== peers mta, attn_res" >> $R
PYTHONPATH=/tmp/site SECTIONS=mta,attn_res OUT=/tmp timeout 280 python3 .peers/peers.py > /tmp/p.txt 2>&1
echo "rc=$?" >> $R; grep -v "^  " /tmp/p.txt >> $R
cat $R
