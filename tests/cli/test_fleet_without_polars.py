"""``tracekit fleet`` where polars (the ``fleet`` extra) is missing: one sentence, exit 1.

polars is hidden from a child process (``sys.modules['polars'] = None`` makes
every import of it fail, as on a machine without it), so this module runs
whether or not polars is installed here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDE = ("import sys; sys.modules['polars'] = None; from tracekit.cli.app import main; "
        "sys.argv[0] = 'tracekit'; main()")


def test_fleet_without_polars_says_how_to_install_it() -> None:
    trace = ROOT / "traces" / "cupy-oom-frag.parquet"
    p = subprocess.run([sys.executable, "-c", HIDE, "fleet", str(trace), "--jobs", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr  # one sentence, no traceback
    assert "polars" in lines[0] and 'pip install -e ".[fleet]"' in lines[0]


def test_other_verbs_run_without_polars() -> None:
    trace = ROOT / "traces" / "cupy-oom-frag.parquet"
    p = subprocess.run([sys.executable, "-c", HIDE, "analyze", str(trace), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
