"""No verb imports pandas: where it is installed, pyarrow imports it at the first ``pa.array``,
``to_numpy`` or ``fill_null`` (0.2 s on the 2-core machine, 0.6 s on the device machine's 16-core
host, whose Python has pandas), so the verbs convert through ``tracekit.trace.arrow`` instead.

A stand-in ``pandas`` package first on the path notes each import of it in a file and then fails
as a missing pandas does (pyarrow then carries on without it); each verb runs in a fresh process
with it, and the note must stay empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"

STAND_IN = '''
import os, traceback
with open(os.environ["TRACEKIT_TEST_PANDAS_NOTE"], "a") as f:
    f.write("".join(traceback.format_stack(limit=8)) + "\\n---\\n")
raise ImportError("pandas is a stand-in here")
'''


def _commands(tmp: Path) -> list[list[str]]:
    frag, torch_oom = str(TRACES / "cupy-oom-frag.parquet"), str(TRACES / "torch-oom.parquet")
    return [
        ["info", torch_oom],
        ["analyze", frag, "--timeline", str(tmp / "timeline.parquet")],
        ["replay", frag, "--sim", "best-fit"],
        ["replay", torch_oom, "--sim", "torch", "-o", str(tmp / "replayed.parquet")],
        ["advise", torch_oom],
        ["advise", frag],
        ["whatif", frag],
        ["report", torch_oom, "-o", str(tmp / "report.html")],
        ["synth", "--pattern", "training", "--events", "2000", "-o", str(tmp / "synth.parquet")],
    ]


@pytest.mark.slow
def test_no_verb_imports_pandas(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "pandas").mkdir(parents=True)
    (site / "pandas" / "__init__.py").write_text(STAND_IN)
    note = tmp_path / "pandas-imports.txt"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "TRACEKIT_TEST_PANDAS_NOTE": str(note)}
    for args in _commands(tmp_path):
        p = subprocess.run([sys.executable, "-m", "tracekit", *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode in (0, 3), (args, p.stderr[-2000:])
        assert not note.exists() or not note.read_text(), (args, note.read_text())


def test_the_stand_in_notes_an_import(tmp_path: Path) -> None:
    """The stand-in is seen: pyarrow's own conversion imports it (so the check above can fail)."""
    site = tmp_path / "site"
    (site / "pandas").mkdir(parents=True)
    (site / "pandas" / "__init__.py").write_text(STAND_IN)
    note = tmp_path / "pandas-imports.txt"
    env = {**os.environ, "PYTHONPATH": str(site), "TRACEKIT_TEST_PANDAS_NOTE": str(note)}
    code = "import numpy as np, pyarrow as pa; pa.array(np.arange(3))"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert note.exists() and note.read_text()
