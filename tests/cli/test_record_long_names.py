"""A program whose code has a very long file name (generated code) still leaves a trace.

Names longer than the reader's bound (16 KiB) are cut by the recorder to the bound with a mark
saying how many bytes were left out, and counted in the trace's metadata (``names_cut``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tracekit.trace import read_trace
from tracekit.trace.stacks import CUT_MARK, MAX_FRAME_TEXT_BYTES, cut_text

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"

PROGRAM = """
    import cupy
    name = "gen_" + "\u00e9" * 60_000 + ".py"  # 120 kB of UTF-8
    ns = {"cupy": cupy}
    exec(compile("def make_" + "f" * 30_000 + "():\\n    return cupy.empty(1 << 20)\\n", name, "exec"), ns)
    make = next(v for k, v in ns.items() if k.startswith("make_"))
    keep = [make() for _ in range(3)]
    print("ok")
"""


def test_a_very_long_file_name_is_cut_and_the_trace_written(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    p = subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", "app.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout == "ok\n" and "Wrote t.parquet" in p.stderr, p.stderr
    assert not (tmp_path / "t.parquet.spool").exists()
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert int((t.events.op == 0).sum()) == 3
    assert t.meta.extra["names_cut"] >= 1
    long = [s for s in t.events.sites if CUT_MARK in s]
    assert long and all(len(s.encode()) <= MAX_FRAME_TEXT_BYTES for s in long)
    table = t.events.stacks
    cut = [f for f in (*table.file, *table.function) if CUT_MARK in f]
    assert cut and all(len(f.encode()) <= MAX_FRAME_TEXT_BYTES for f in cut)


@given(st.text(max_size=300), st.integers(min_value=48, max_value=400))
def test_cut_text_keeps_within_the_bound(text: str, limit: int) -> None:
    out = cut_text(text, limit)
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        assert out == text
    else:
        assert len(out.encode("utf-8", "surrogatepass")) <= limit and CUT_MARK in out
        head = out[: out.index(CUT_MARK)]
        assert text.startswith(head)
        gone = int(out[out.index(CUT_MARK) + len(CUT_MARK):].split()[0])
        assert gone == len(raw) - len(head.encode("utf-8", "surrogatepass"))
