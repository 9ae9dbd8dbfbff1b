# Tensor-core schedule: the staging stores' quad order (WGRAD_TC_SWAP) and tiles in bands of
# rows (WGRAD_TC_GROUP), alternated twice, after the tensor-core tests (which check that the
# schedule leaves the bits alone); then FLCE BT 8,192 with the BF16 options each way, and the
# 16-bit softmax backward from the output with whole chunks a lane against half chunks.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul tensor_core" "fused_linear tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 150 /tmp/tb/$1 $2 > /tmp/t-$1.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
B=.bench/s14/bench
for r in 1 2; do
  for v in "0 1" "1 1" "1 8"; do
    set -- $v
    WGRAD_TC_SWAP=$1 WGRAD_TC_GROUP=$2 timeout 100 $B --only "matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048 bf16 tc+grads" > /tmp/v.txt 2>&1
    echo "rc=$?" | sed "s/^/swap$1 group$2 r$r /"
    grep -E "TFLOP/s" /tmp/v.txt | sed "s/^/swap$1 group$2 r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
for v in "0 1" "1 8"; do
  set -- $v
  WGRAD_TC_SWAP=$1 WGRAD_TC_GROUP=$2 timeout 60 $B --only "fused_linear_ce_fwd_bwd BT8192 bf16 tc+grads" > /tmp/f.txt 2>&1
  echo "rc=$?"; grep -E "TFLOP/s|peak" /tmp/f.txt | sed "s/^/swap$1 group$2 /"
done > $OUT/flce8192.txt 2>&1
cat $OUT/flce8192.txt
for w in 0 1 0 1; do
  WGRAD_SOFTMAX_WHOLE=$w timeout 40 $B --only "softmax_backward" > /tmp/s.txt 2>&1
  grep -E "bf16" /tmp/s.txt | grep -E "GB/s" | sed "s/^/whole$w /"
done > $OUT/softmax-whole.txt 2>&1
cat $OUT/softmax-whole.txt
