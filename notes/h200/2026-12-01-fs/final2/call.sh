set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 80 target/release/examples/check matmul_as mlp fused_linear_cross_entropy fused_linear_cross_entropy_scaled fused_linear_distillation fused_linear_distillation_none preference_loss kto_loss embedding embedding_max_norm_freq adamw adamw_amsgrad_maximize sgd sgd_maximize grad_norm transformer_step > $OUT/check2.txt 2>&1; echo "check rc=$?"; tail -1 $OUT/check2.txt; grep -E "FAIL|ERROR" $OUT/check2.txt | head
timeout 110 target/release/examples/bench --only "fused_linear_ce_fwd_bwd BT8192" > $OUT/bench2.txt 2>&1; echo "bench rc=$?"
grep -E "TFLOP|median|chunks" $OUT/bench2.txt
