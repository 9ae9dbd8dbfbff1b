set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s11/bench2
for r in 1 2; do
  for v in rule 128; do
    if [ $v = rule ]; then unset WGRAD_NORM_FWD_LANES; else export WGRAD_NORM_FWD_LANES=$v; fi
    timeout 100 $B --only "rms_norm fwd,layer_norm fwd,add_rms_norm fwd" > /tmp/$v-$r.txt 2>&1
    grep -E "^(rms_norm|layer_norm|add_rms_norm) fwd|rror" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
unset WGRAD_NORM_FWD_LANES
cat $OUT/ab.txt
WGRAD_NORM_FWD_LANES=128 timeout 100 $B --only "rms_norm fwd,layer_norm fwd,add_rms_norm fwd" --pipeline-stats > $OUT/stats.txt 2>&1
grep "Register Count" $OUT/stats.txt | grep -v "^norm_mid\|^norm_wide" | cut -c1-400
