# bench_seg = the build with the MTA partials in column segments of 256 and the gated delta of
# 2b01fae (16 value columns a chunk_states / chunk_dstate workgroup); bench_new2 = 2b01fae;
# bench_cols8 / bench_cols4: 2b01fae with CS_COLS 8 (32 parts: 4 state rows a lane at K 128)
# and 4 (64 parts: 2 rows)
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
for r in 1 2; do
  for b in new2 seg; do timeout 40 .bench/bench_$b --profile --only mta > $OUT/mta-$b-$r.txt 2>&1; done
  for b in seg cols8 cols4; do timeout 80 .bench/bench_$b --profile --only gated_delta_chunked > $OUT/gdn-$b-$r.txt 2>&1; done
done
timeout 60 .bench/bench_seg --pipeline-stats --only gated_delta_chunked_fwd,mta_fwd_bwd > $OUT/stats.txt 2>&1
