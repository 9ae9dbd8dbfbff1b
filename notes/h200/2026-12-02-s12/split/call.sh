set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
D=.bench/s12
timeout 100 $D/test-cast > $OUT/tests-cast.txt 2>&1; echo "cast rc=$?"; grep "test result" $OUT/tests-cast.txt
timeout 200 $D/test-loss softmax > $OUT/tests-loss.txt 2>&1; echo "loss rc=$?"; grep -E "test result|FAILED|panicked" $OUT/tests-loss.txt | head
for r in 1 2; do
  for v in base split; do
    if [ $v = base ]; then B=$D/bench-var; else B=$D/bench-split; fi
    WGRAD_SMX_VAR=0 timeout 100 $B --only "softmax,log_softmax" > /tmp/$v-$r.txt 2>&1
    grep -E "^(softmax|log_softmax) .*bf16|^copy " /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
timeout 150 $D/check softmax,log_softmax,cast,subgroup_rows,tree_rows,softmax_backward_as > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -5 $OUT/check.txt
