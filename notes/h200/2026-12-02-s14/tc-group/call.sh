# Tensor-core tiles in bands of rows (WGRAD_TC_GROUP 1, 8), alternated twice, after the
# tensor-core tests (which check that bands leave the bits alone); then the BF16 rounding A/B. The `check` of the tensor-core product (now with BF16 operands
# outside F16's range) after the tests.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul tensor_core" "fused_linear tensor_cores" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 150 /tmp/tb/$1 $2 > /tmp/t-$1.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 60 .bench/s14/check matmul_tensor_cores >> $OUT/tests.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
# The BF16 rounding tests (bit for bit against the host), with the integer rounding and the split.
for n in /tmp/tb/norm .bench/s14/norm-split; do
  timeout 100 $n bf16 > /tmp/n.txt 2>&1; echo "$n bf16 rc=$? $(grep 'test result' /tmp/n.txt)"
  grep -A12 "panicked" /tmp/n.txt | head -20
done >> $OUT/tests.txt 2>&1
cat $OUT/tests.txt
B=.bench/s14/bench
for r in 1 2; do
  for g in 1 8; do
    WGRAD_TC_GROUP=$g timeout 110 $B --only "matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048" > /tmp/v.txt 2>&1
    echo "rc=$?" | sed "s/^/group$g r$r /"
    grep -E "TFLOP/s|peak" /tmp/v.txt | sed "s/^/group$g r$r /"
  done
done > $OUT/ab.txt 2>&1
grep -v "GB/s" $OUT/ab.txt
# BF16 rounding by Veltkamp's split (three float operations a value, its low half checked)
# against the integer rounding: a second binary (`bench-split`), alternated twice.
for r in 1 2; do for v in bench bench-split; do
  timeout 100 .bench/s14/$v --only "rms_norm fwd,layer_norm fwd,add_rms_norm fwd,softmax,log_softmax,rope_fwd,rope_bwd,swiglu_fwd,swiglu_bwd" > /tmp/n.txt 2>&1
  echo "$v r$r rc=$?"; grep median /tmp/n.txt | grep -v " f32 " | sed "s/^/$v r$r /"
done; done > $OUT/split.txt 2>&1
cat $OUT/split.txt
