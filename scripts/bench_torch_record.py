"""`record --torch` against PyTorch's own memory history, on a torchvision model (H200).

Fresh processes, interleaved: a ResNet-18 training loop (batch 64, 224×224, SGD) timed inside the
program after warm-up, run three ways: plain; with the program itself calling
``torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python")``
(what PyTorch's docs tell a user to do); and unchanged under ``tracekit record --torch``. Prints
the min and median loop seconds of each, their ratios to PyTorch's own history, and the events.
    PYTHONPATH=. python3 scripts/bench_torch_record.py [--steps 60] [--repeats 5] --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

APP = """
import os, sys, time
import torch, torchvision
if os.environ.get("OWN_HISTORY") == "1":
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python")
model = torchvision.models.resnet18().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (64,), device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
for _ in range(5):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    step()
torch.cuda.synchronize()
print("LOOP", time.perf_counter() - t0)
"""


def one(variant: str, app: Path, steps: int, out: Path) -> float:
    env = {**os.environ, "OWN_HISTORY": "1" if variant == "torch_history" else "0"}
    if variant == "tracekit_record_torch":
        cmd = [sys.executable, "-m", "tracekit", "record", "--torch", "--force", "-o", str(out), str(app),
               str(steps)]
    else:
        cmd = [sys.executable, str(app), str(steps)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("LOOP ")]
    if p.returncode or not line:
        raise RuntimeError(f"{variant}: exit {p.returncode}: {p.stderr[-400:]}")
    return float(line[-1].split()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    variants = ("plain", "torch_history", "tracekit_record_torch")
    times: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as d:
        app = Path(d) / "train.py"
        app.write_text(APP)
        out = Path(d) / "t.parquet"
        for _ in range(args.repeats):
            for v in variants:
                times[v].append(one(v, app, args.steps, out))
        events = None
        if out.exists():
            from tracekit.trace import read_trace

            events = len(read_trace(out, extras=False).events)
    own = min(times["torch_history"])
    result = {
        "steps": args.steps, "repeats": args.repeats, "events": events,
        "min_s": {v: min(t) for v, t in times.items()},
        "median_s": {v: statistics.median(t) for v, t in times.items()},
        "ratio_to_torch_history_min": {v: min(t) / own for v, t in times.items()},
        "ratio_to_torch_history_median": {v: statistics.median(t) / statistics.median(times["torch_history"])
                                          for v, t in times.items()},
        "times": times,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
