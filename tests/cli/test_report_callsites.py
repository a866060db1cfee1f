"""``tracekit report`` names every OOM's call-site as ``tracekit analyze --json`` does (the page's model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # the model readers
from test_page_model import FATAL_SITE, ooms, read_model, site_names

ROOT = Path(__file__).resolve().parents[2]


def tracekit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=ROOT)


def test_oom_labels_equal_analyzes(traces_dir: Path, tmp_path: Path) -> None:
    trace = str(traces_dir / "torch-handled-oom.parquet")
    a = tracekit("analyze", trace, "--json")
    assert a.returncode == 0, a.stderr
    summary = json.loads(a.stdout)
    r = tracekit("report", trace, "-o", str(tmp_path / "x.html"))
    assert r.returncode == 0, r.stderr
    m = read_model(tmp_path / "x.html")
    names = site_names(m)
    assert [names[o["stack"]] for o in ooms(m)] == [o["site"] for o in summary["ooms"]]
    fatal = next(o for o in ooms(m) if not o["handled"])
    assert names[fatal["stack"]] == summary["oom"]["site"]
    assert summary["oom"]["site"] == FATAL_SITE
