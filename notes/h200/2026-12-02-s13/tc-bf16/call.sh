# BF16 / rounded-F32 operands on the tensor cores: the tests that exercise them, the products'
# and FLCE's bench rows, and Liger's FLCE in the same command.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
D=.bench/s13
tar -C /tmp -xJf .bench/tests.tar.xz
{
  for t in "matmul tensor_core" "fused_linear tensor_cores" "mlp tensor_cores"; do
    set -- $t
    s=$(date +%s)
    timeout 120 /tmp/tb/$1 $2 > /tmp/t-$1.txt 2>&1
    echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
    grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -40
  done
} > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
timeout 330 $D/bench --only matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; tail -30 $OUT/bench.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
OUT=$OUT SECTIONS=flce timeout 200 python3 .peers/peers.py > $OUT/peers.txt 2>&1
echo "peers rc=$?"; tail -12 $OUT/peers.txt
