#!/usr/bin/env bash
# Record PyTorch snapshots that exercise the caching allocator's release path under
# max_split_size_mb (release_available_cached_blocks before release_cached_blocks), with
# `tracekit record --torch`, keep the raw snapshots, and replay each through the `torch`
# policy to compare reserved bytes after every request. Everything is packed as
# $OUT/sim.tar.gz (also on failure). BUDGET_S (default 240) bounds the run.
#   OUT=/some/dir bash scripts/gpu_sim.sh
NAME=sim
source "$(dirname "$0")/gpu_common.sh"
W=$R
PY=${PYTHON:-python3}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda); print("mem_get_info", torch.cuda.mem_get_info(0))'
  git log --oneline -1; } > "$W/env.txt" 2>&1
cat "$W/env.txt"

# name  max_split_size_mb  cap GiB  seed
record() {
  local name=$1 mb=$2 cap=$3 seed=$4
  local t; t=$(left)
  if [ "$t" -lt 30 ]; then echo "skip $name: budget spent"; return; fi
  echo "== record $name (max_split_size_mb:$mb, cap ${cap} GiB, seed $seed)"
  PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:$mb" timeout $(( t - 20 )) \
    "$PY" -m tracekit record --torch -o "$W/$name.parquet" \
    scripts/torch_workload_maxsplit.py --seed "$seed" --cap-gib "$cap" \
    > "$W/$name.log" 2>&1
  echo "exit $?"; tail -5 "$W/$name.log"
  [ -f "$W/$name.pickle" ] && gzip -9 -k "$W/$name.pickle" && rm -f "$W/$name.pickle"
  ls -l "$W/$name".* 2>/dev/null
}

record torch-maxsplit 64 3 0
record torch-maxsplit-b 200 2 1

echo "== replay: reserved bytes after every request, simulator against the recording"
timeout $(( $(left) > 10 ? $(left) - 5 : 5 )) "$PY" - "$W"/torch-maxsplit*.parquet > "$W/replay.txt" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "tests")
from test_fidelity import agreement
from tracekit.trace import read_trace
for path in sys.argv[1:]:
    t = read_trace(path)
    a = agreement(t)
    print(path, "requests", a.requests, "reserved agree", a.reserved_same, "first miss", a.first_reserved_miss,
          "segments real/sim", len(a.seg_real), len(a.seg_sim), "oom real/sim", a.oom_real, a.oom_sim)
EOF
cat "$W/replay.txt"
