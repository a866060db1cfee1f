"""``record --torch`` of a real training run that ends without finishing: every allocation kept.

A torchvision ResNet-18 (a small convolutional network where torchvision is missing) trains on the
GPU under ``tracekit record --torch``; after each step the program writes PyTorch's own count of
allocations (``memory_stats()["allocation.all.allocated"]``, the witness) to a file. It then ends by
``os._exit``, by SIGKILL of itself, or is killed with SIGKILL from outside mid-step. The trace (the
watcher's, from the tracker's ring, ``tracekit.record.torch_ring``) must hold as many allocations as
PyTorch counted (after a kill from outside: at least the last count read), with no ring, head or
spool left. A normal end still writes the trace from PyTorch's snapshot, the ring attached.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracekit.trace import Op, read_trace

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
    import json, os, signal, sys, time
    import torch
    try:
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
    except ImportError:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(64, 10))
    model = model.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end, steps = sys.argv[1], int(sys.argv[2])

    def count():
        torch.cuda.synchronize()
        n = torch.cuda.memory_stats()["allocation.all.allocated"]
        with open("count.tmp", "w") as f:
            json.dump({{"mallocs": n}}, f)
        os.replace("count.tmp", "count.json")

    step = 0
    while end == "outside" or step < steps:
        x = torch.randn(32 + step % 3, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (x.shape[0],), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        del x, y, loss
        step += 1
        count()
    {end}
"""
ENDS = {
    "normal": ("pass", 0),
    "os._exit": ("os._exit(3)", 3),
    "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
}


def _keep(path: Path) -> None:
    keep = os.environ.get("TRACEKIT_GPU_OUT")
    if keep and path.exists():  # the GPU script keeps the traces these tests make
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


def _start(tmp: Path, end: str, name: str, steps: int = 12) -> subprocess.Popen[str]:
    code = ENDS[end][0] if end in ENDS else "pass"
    (tmp / "train.py").write_text(textwrap.dedent(PROGRAM.format(end=code)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "tracekit", "record", "--torch", "-o", name, "train.py", end, str(steps)]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _mallocs(path: Path) -> int:
    t = read_trace(path, strict=True)  # waits for the watcher, if it is still writing
    return int((t.events.op == Op.MALLOC).sum())


def _left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.suffix in (".torchring", ".torchhead", ".finishing"))


@pytest.mark.parametrize("end", list(ENDS))
def test_every_allocation_survives_the_end(tmp_path: Path, end: str) -> None:
    name = f"torch-{end.replace('.', '').lower()}.parquet"
    p = _start(tmp_path, end, name)
    _, err = p.communicate(timeout=400)
    assert p.returncode == ENDS[end][1], err
    counted = json.loads((tmp_path / "count.json").read_text())["mallocs"]
    trace = tmp_path / name
    got = _mallocs(trace)
    _keep(trace)
    meta = read_trace(trace).meta.extra
    print(f"{end}: PyTorch counted {counted} allocations, the trace holds {got}; "
          f"torch_ring {meta.get('torch_ring')}")
    assert got == counted
    assert _left(tmp_path) == []
    if end == "normal":
        assert meta["torch_ring"]["attached"] is True, meta["torch_ring"]
    else:
        assert meta["finished_by"] == "watcher" and meta["torch_ring"]["missing"] == 0


def test_sigkill_from_outside_mid_step(tmp_path: Path) -> None:
    name = "torch-killed.parquet"
    p = _start(tmp_path, "outside", name)
    count = tmp_path / "count.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not count.exists() and p.poll() is None:
        time.sleep(0.05)
    time.sleep(3.0)  # some steps more: the kill lands mid-step
    counted = json.loads(count.read_text())["mallocs"]
    p.send_signal(signal.SIGKILL)  # tracekit record is the program's process (it runs in-process)
    p.communicate(timeout=120)
    trace = tmp_path / name
    got = _mallocs(trace)
    _keep(trace)
    print(f"killed from outside: PyTorch had counted {counted} at its last step, the trace holds {got}")
    assert got >= counted
    assert _left(tmp_path) == []
