"""On a GPU: the capacity advise names when nothing fits, run for real (docs/fidelity.md).

    python3 scripts/gpu_fit_capacity.py OUT [--case NAME:CONF:CAP:LABEL ...]

When no setting fits under a ResNet-50 recording's cap, ``advise`` names the capacity at which its best
setting fits with the margin (``fit_capacity_bytes``), next to the smallest one its replay gets
through (``min_capacity_bytes``, no headroom). Each case runs ``scripts/torch_workload_resnet.py``
(torchvision's ResNet-50, AMP, ``cudnn.benchmark``: the committed recordings' program) under
``tracekit record --torch`` with ``PYTORCH_CUDA_ALLOC_CONF=CONF`` and the program's own memory
fraction set to CAP / the device's total, for the eight steps the recordings reached (they died in
the eighth). Beside it, ``scripts/witness/sitecustomize.py`` writes PyTorch's own
``max_memory_reserved`` and ``num_ooms`` at exit. Writes ``OUT/LABEL.parquet`` (the run's trace: whether
it got past the recording's failing request is judged where the trace comes back,
``tracekit.advise.rerun.past``), ``OUT/LABEL.log`` and ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 8  # steps 0..7: the recordings died in step 7 (96 images of 288 x 288)
CASES = [
    # committed trace : best setting : capacity (bytes) : label
    "torch-resnet-fraction:max_split_size_mb:64:4575985664:fraction-fit",
    "torch-resnet35:max_split_size_mb:128,garbage_collection_threshold:0.8:5429526528:resnet35-fit",
    "torch-resnet-fraction:max_split_size_mb:64:4483710976:fraction-min",
]


def run_workload(label: str, conf: str, cap: int, total: int, steps: int, out: Path, timeout: float,
                 workload: str = "scripts/torch_workload_resnet.py") -> dict:  # type: ignore[type-arg]
    """One run of ``workload`` (a script taking ``--fraction`` and ``--steps``) for ``steps`` steps
    under ``PYTORCH_CUDA_ALLOC_CONF=conf``, its own
    fraction ``cap / total``, recorded to ``out/label.parquet`` (log ``out/label.log``) with the witness
    beside it: exit code, seconds, the steps it printed and the witness's last line."""
    witness = out / f"{label}-witness.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "scripts" / "witness")])
    env["TRACEKIT_WITNESS"] = str(witness)
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env.pop("PYTORCH_ALLOC_CONF", None)
    cmd = [sys.executable, "-m", "tracekit", "record", "--torch", "-o", str(out / f"{label}.parquet"),
           workload, "--fraction", repr(cap / total), "--steps", str(steps)]
    t0 = time.time()
    with (out / f"{label}.log").open("wb") as fh:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    log = (out / f"{label}.log").read_text(errors="replace")
    seen = [json.loads(x) for x in witness.read_text().splitlines()] if witness.exists() else []
    return {"exit_code": rc, "seconds": round(time.time() - t0, 1),
            "steps_done": sum(1 for line in log.splitlines() if line.startswith("step ")),
            "witness": seen[-1] if seen else None,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def device_and_out(out: Path) -> tuple[str, int, Path]:
    """Device 0's name and total bytes (torch imported here only, never kept), and ``out`` made."""
    import torch

    name, total = torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory
    del torch
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    return name, total, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--case", action="append", default=None, help="NAME:CONF:CAP:LABEL (CONF may hold ':')")
    ap.add_argument("--timeout", type=float, default=240)
    a = ap.parse_args()
    name, total, out = device_and_out(a.out)
    results = []
    for case in a.case or CASES:
        trace, rest = case.split(":", 1)
        conf, cap_s, label = rest.rsplit(":", 2)
        cap = int(cap_s)
        got = run_workload(label, conf, cap, total, STEPS, out, a.timeout)
        results.append({"label": label, "trace": trace, "conf": conf, "cap_bytes": cap,
                        "fraction": cap / total, **got})
        print(json.dumps(results[-1]), flush=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc = {"device": name, "total_bytes": total, "date_utc": when, "steps": STEPS, "runs": results}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
