# build: scripts/tests-pack.sh at f67c98b (24 release test binaries, stripped, xz); carry .gl .bench
ONLY="hostile optim model activation gated_delta cast attention spirv wgrad engine embedding fused_linear norm engine_lost loss matmul mlp msl grpo tensor rope reduce preference" TEST_TIMEOUT=200 bash scripts/tests-h200.sh
