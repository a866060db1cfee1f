"""``tracekit report --user-code PATH``: the frames under PATH are the user's in the page's FRAME table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # the stacks trace
from test_page_model import read_model, stacks_trace

ROOT = Path(__file__).resolve().parents[2]
TORCH = "/venv/lib/python3.12/site-packages/torch"


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", "report", *args], capture_output=True, text=True,
                          cwd=ROOT)


def test_user_code_paths_mark_the_frames_under_them(tmp_path: Path) -> None:
    trace = stacks_trace(tmp_path / "s.parquet")
    r = report(str(trace), "-o", str(tmp_path / "default.html"))
    assert r.returncode == 0, r.stderr
    assert read_model(tmp_path / "default.html")["frames"]["user"] == [True, True, False, True] + [False] * 3
    out = tmp_path / "torch.html"
    r = report(str(trace), "-o", str(out), "--user-code", TORCH, "--user-code", "train.py")
    assert r.returncode == 0, r.stderr
    m = read_model(out)
    # train.py is relative: it counts as given and made absolute; the recorded "train.py" is under it.
    assert m["frames"]["user"] == [True, True, True, False, True, False, False]
    assert m["user_code"] == [TORCH, "train.py", os.path.join(str(ROOT), "train.py")]


def test_help_names_the_option() -> None:
    r = report("--help")
    assert r.returncode == 0 and "--user-code" in r.stdout
