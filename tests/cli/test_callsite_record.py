"""The user's own line on a recording with whole stacks, through CuPy's stand-in (tests/fakecupy).

The same program as the GPU test (tests/gpu/test_callsite_gpu.py): ``prog.py``'s ``step``
(line STEP) calls the helper ``lib/mylib.py``'s ``layer`` (line LAYER), which asks CuPy for
memory and keeps it. CuPy's own frames (here the stand-in's, a folder named ``cupy``) are never
the request nor the user's line, and tracekit's are never shown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tracekit.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakecupy"
LIB = "import cupy as cp\n\n\ndef layer(n):\n    return cp.empty(n)\n"
LAYER = 5
PROG = ("from lib.mylib import layer\n\n\n\n\ndef step():\n    out = []\n    for _ in range(4):\n"
        "        out.append(layer(1 << 20))\n    return out\n\n\nkeep = step()\n")
STEP = 9
runner = CliRunner()


def _recorded(tmp: Path) -> Path:
    (tmp / "lib").mkdir()
    (tmp / "lib" / "__init__.py").write_text("")
    (tmp / "lib" / "mylib.py").write_text(LIB)
    (tmp / "prog.py").write_text(PROG)
    out = tmp / "t.parquet"
    path = os.pathsep.join([str(ROOT), str(FAKE), str(tmp)])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", str(out), "prog.py"],
                       capture_output=True, text=True, cwd=tmp, env=env, timeout=120)
    assert p.returncode == 0 and out.exists(), p.stderr
    return out


def _json(*args: str) -> dict:
    r = runner.invoke(app, ["analyze", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_helper_is_the_users_line_until_user_code_says_otherwise(tmp_path: Path) -> None:
    out = _recorded(tmp_path)
    d = _json(str(out), "--tree", "--tree-native")
    (top,) = d["leaks"]
    assert (top["site"], top["bytes"], top["blocks"]) == (f"lib/mylib.py:{LAYER}:layer", 4 << 20, 4)
    assert top["user_site"] == top["request_site"] == f"lib/mylib.py:{LAYER}:layer"
    (leak,) = _json(str(out), "--user-code", "prog.py")["leaks"]
    assert leak["site"] == f"prog.py:{STEP} in step → lib/mylib.py:{LAYER}"
    assert leak["user_site"] == f"prog.py:{STEP}:step"
    assert leak["request_site"] == f"lib/mylib.py:{LAYER}:layer"
    never = d["trees"]["never_freed"]
    assert never["bytes"] == d["leaked_bytes"] == 4 << 20
    text = json.dumps(never)
    assert "tracekit/" not in text and "memory.py" in text  # CuPy's frames shown, as library frames

    def frames(node: dict) -> list[tuple[str, bool]]:
        return [(node["frame"], node["user"])] + [f for c in node["children"] for f in frames(c)]

    marked = {f for f, user in frames(never) if user}
    assert f"lib/mylib.py:{LAYER} in layer" in marked and not any("cupy" in f for f in marked)
