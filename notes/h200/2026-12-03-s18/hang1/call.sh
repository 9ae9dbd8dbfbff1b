# Engine test binary on the H200: repeated parallel runs; on a hang, thread stacks (kernel + gdb).
set -uo pipefail
R=$(pwd)
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
cd /tmp && tar xJf "$R/.dbg/gdb.tar.xz" && cd "$R"
{ head -2 /etc/os-release; echo "ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>&1)"; nproc; nvidia-smi --query-gpu=driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
for bin in ${BINS:-engine}; do
  xz -dc .dbg/$bin.xz > /tmp/$bin; chmod +x /tmp/$bin
  hung=0
  for i in $(seq 1 ${RUNS:-12}); do
    /tmp/$bin > /tmp/$bin-$i.txt 2>&1 & P=$!
    for t in $(seq 1 40); do sleep 0.5; kill -0 $P 2>/dev/null || break; done
    if kill -0 $P 2>/dev/null; then
      echo "$bin run $i: HUNG after 20 s"
      { cat /tmp/$bin-$i.txt; for T in /proc/$P/task/*; do echo "== $T $(cat $T/comm) wchan=$(cat $T/wchan) syscall=$(cat $T/syscall)"; cat $T/stack 2>/dev/null; done; } > $OUT/hang-$bin-$i.txt 2>&1
      timeout 60 /tmp/.gdb/run.sh $P >> $OUT/hang-$bin-$i.txt 2>&1
      kill -9 $P; wait $P 2>/dev/null; hung=$((hung+1))
      [ $hung -ge 2 ] && break
    else
      wait $P; echo "$bin run $i rc=$? $(grep 'test result' /tmp/$bin-$i.txt)"
    fi
  done
done
