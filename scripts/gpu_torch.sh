#!/usr/bin/env bash
# PyTorch on the GPU: run the snapshot workloads, import each snapshot with
# tracekit, run the GPU tests of the PyTorch importer / recorder, and pack
# everything into $OUT/torch.tar.gz. Writes only under $OUT (or $1).
# Usage: OUT=/some/dir bash scripts/gpu_torch.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-${1:?give an output folder as \$OUT or \$1}}
W="$OUT/torch"
mkdir -p "$W/snapshots" "$W/imported"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
{
  date -u
  nvidia-smi || true
  "$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0]); print("mem_get_info", torch.cuda.mem_get_info(0)); p = torch.cuda.get_device_properties(0); print(p)' || true
} > "$W/env.txt" 2>&1
cat "$W/env.txt"

"$PY" scripts/torch_workloads.py all --out "$W/snapshots" 2>&1 | tee "$W/workloads.log"

TIME=""
[ -x /usr/bin/time ] && TIME="/usr/bin/time -v"
for f in "$W"/snapshots/*.pickle; do
  [ -e "$f" ] || continue
  b=$(basename "$f" .pickle)
  $TIME env PYTHONPATH=. "$PY" -m tracekit import torch "$f" -o "$W/imported/$b.parquet" \
    > "$W/imported/$b.log" 2>&1 || echo "import of $b failed (see imported/$b.log)"
done

if ls tests/*/test_torch*.py >/dev/null 2>&1; then
  TRACEKIT_GPU_OUT="$W/gputests" PYTHONPATH=. "$PY" -m pytest -m gpu tests/*/test_torch*.py -q -p no:cacheprovider \
    2>&1 | tee "$W/pytest.log"
fi

tar czf "$OUT/torch.tar.gz" -C "$OUT" torch && rm -rf "$W"
# at most 16 MiB come back per file: split a large archive (cat the parts to rejoin)
if [ "$(stat -c %s "$OUT/torch.tar.gz")" -gt 15000000 ]; then
  split -b 15000000 -d "$OUT/torch.tar.gz" "$OUT/torch.tar.gz.part" && rm "$OUT/torch.tar.gz"
fi
ls -l "$OUT"
