"""The user's own line on a real recording with whole stacks (format v3), CuPy on a GPU.

A program ``prog.py`` calls ``step`` (line STEP), which calls a helper library ``lib/mylib.py``
(``layer``, line LAYER), which asks CuPy for memory. By default both files are the user's code, so
the call-site is the helper's line alone; with ``--user-code prog.py`` the helper is a library and
the call-site is "prog.py:STEP in step → lib/mylib.py:LAYER". The arrays are kept, so they are
never freed: the leaks and the never-freed tree name them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import read_trace

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
LIB = "import cupy as cp\n\n\ndef layer(n):\n    return cp.zeros(n, dtype=cp.uint8)\n"
LAYER = 5
PROG = ("import cupy as cp\nfrom lib.mylib import layer\n\n\ndef step():\n"
        "    return [layer(1 << 20) for _ in range(4)]\n\n\nkeep = step()\ncp.cuda.Device().synchronize()\n")
STEP = 6


def test_the_label_names_the_users_line_and_the_request(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "mylib.py").write_text(LIB)
    (tmp_path / "prog.py").write_text(PROG)
    out = tmp_path / "t.parquet"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", str(out), "prog.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert p.returncode == 0 and out.exists(), p.stderr
    keep = os.environ.get("TRACEKIT_GPU_OUT")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "callsite-v3.parquet").write_bytes(out.read_bytes())
    tr = read_trace(out, strict=True)
    assert tr.events.stacks.n_stacks > 0, "the recording has no whole stacks (format v3)"
    runner = CliRunner()
    r = runner.invoke(app, ["analyze", str(out), "--json", "--tree"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    top = d["leaks"][0]
    assert top["bytes"] == 4 << 20 and top["site"] == f"lib/mylib.py:{LAYER}:layer", top
    # The frames are relative to the recording's folder: the PATH is given as they are named.
    r = runner.invoke(app, ["analyze", str(out), "--json", "--user-code", "prog.py"])
    assert r.exit_code == 0, r.output
    top = json.loads(r.stdout)["leaks"][0]
    assert top["site"] == f"prog.py:{STEP} in step → lib/mylib.py:{LAYER}", top
    assert top["user_site"] == f"prog.py:{STEP}:step" and top["request_site"] == f"lib/mylib.py:{LAYER}:layer"
    never = d["trees"]["never_freed"]
    assert never["bytes"] == d["leaked_bytes"] >= 4 << 20

    def marked(node: dict) -> list[str]:
        return ([node["frame"]] if node["user"] else []) + [f for c in node["children"] for f in marked(c)]

    assert f"lib/mylib.py:{LAYER} in layer" in marked(never) and not any("cupy" in f for f in marked(never))
    assert "tracekit/" not in json.dumps(never)  # the recorder's own frames are never shown
