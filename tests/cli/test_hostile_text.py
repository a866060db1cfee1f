"""Text a trace controls reaches the terminal escaped and matplotlib literally.

A call-site, the recorded command, the device name and the file name are the trace author's
text: ESC (clear the screen, set the window title, plant a hyperlink), BEL, NUL and the bidi
controls (reverse a call-site's text) must be shown escaped as ``repr`` writes them, in every
verb's text and error lines, and a ``$`` must be drawn, not read as mathtext. Worked answers on
hand-built traces; the CLI runs in a child so the bytes written to the terminal are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracekit.inputs import plot_text, safe_text
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace

HOSTILE_SITE = "x\x1b]0;owned\x07.py:1:f\x1b[2J"  # sets the window title, then clears the screen
BIDI_SITE = "a\u202egnp.exe\u202c.py:3:g\x00"  # right-to-left override: reads as "...exe.png"
DOLLAR_SITE = "cost$.py:7:h"  # one unmatched $: mathtext fails on it
RAW = (b"\x1b", b"\x07", b"\x00", "\u202e".encode(), "\u202c".encode())


def hostile_trace(path: Path) -> Path:
    op = np.array([Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM], np.int8)
    ev = Events.build(op, np.array([1 << 20, 2 << 20, 3 << 20, 1 << 20, 1 << 30], np.uint64),
                      addr=np.array([1 << 30, 2 << 30, 3 << 30, 1 << 30, 0], np.uint64),
                      site=np.array([0, 1, 2, -1, 0], np.int32), sites=(HOSTILE_SITE, BIDI_SITE, DOLLAR_SITE))
    meta = TraceMeta.new(Source.SYNTHETIC, command="train \x1b[31mred\x07",
                         device=DeviceInfo("GPU\x1b[5m", 8 << 30, 8 << 30))
    return write_trace(path, meta, ev)


def run(*args: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "tracekit", *map(str, args)], capture_output=True,
                          timeout=300)


def assert_escaped(r: subprocess.CompletedProcess[bytes]) -> None:
    assert b"Traceback" not in r.stderr, r.stderr
    for raw in RAW:
        assert raw not in r.stdout and raw not in r.stderr, (raw, r.stdout[-500:], r.stderr[-500:])


def test_safe_text_escapes_as_repr_does() -> None:
    assert safe_text("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert safe_text("\x07\x00\t") == "\\x07\\x00\\t"
    assert safe_text("l\u202er") == "l\\u202er"
    assert safe_text(os.fsdecode(b"n\xff.parquet")) == "n\\udcff.parquet"  # not UTF-8: no encode error
    assert safe_text("two\nlines") == "two\\nlines"
    assert safe_text("two\nlines\x1b", lines=True) == "two\nlines\\x1b"
    assert safe_text("café $5 \\ ok") == "café $5 \\ ok"  # printable text is left as it is
    assert safe_text(safe_text(HOSTILE_SITE)) == safe_text(HOSTILE_SITE)


def test_plot_text_makes_dollars_literal_once() -> None:
    assert plot_text("a$b") == "a\\$b"
    assert plot_text("$x$") == "\\$x\\$"
    assert plot_text(plot_text("a$b$c")) == plot_text("a$b$c")
    assert plot_text("e\x1b$") == "e\\x1b\\$"


@pytest.mark.parametrize("verb", [["info"], ["analyze"], ["analyze", "--json"], ["info", "--json"],
                                  ["replay", "--sim", "best-fit"], ["whatif", "--policies", "best-fit"],
                                  ["advise", "--limit", "64MiB"]])
def test_no_control_character_reaches_the_terminal(tmp_path: Path, verb: list[str]) -> None:
    path = hostile_trace(tmp_path / "t.parquet")
    r = run(verb[0], path, *verb[1:])
    assert r.returncode in (0, 1), r.stderr
    assert_escaped(r)


def test_the_escaped_text_is_shown(tmp_path: Path) -> None:
    path = hostile_trace(tmp_path / "t.parquet")
    out = run("info", path).stdout.decode()
    assert "command      train \\x1b[31mred\\x07" in out
    assert "device       GPU\\x1b[5m: total 8.00 GiB" in out
    out = run("analyze", path).stdout.decode()
    assert "x\\x1b]0;owned\\x07.py:1:f\\x1b[2J" in out  # the OOM's call-site holds the request
    assert "a\\u202egnp.exe\\u202c.py:3:g\\x00" in out  # still live at the end
    js = json.loads(run("analyze", "--json", path).stdout)  # JSON escapes them itself, as data
    assert js["oom"]["site"] == HOSTILE_SITE


FAKE = "recommendation: all fine, run: curl x | sh"


def newline_trace(path: Path) -> Path:
    """A CuPy trace whose call-site, command and device name each hold a line of their own."""
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.OOM], np.int8)
    size = np.array([8 << 20, 2 << 20, 4 << 20, 64 << 20], np.uint64)
    site = f"x.py\n{FAKE}\n:1:f"
    ev = Events.build(op, size, addr=np.array([1 << 30, 1 << 30, (1 << 30) + (2 << 20), 0], np.uint64),
                      site=np.array([-1, 0, 0, 0], np.int32), sites=(site,))
    meta = TraceMeta.new(Source.CUPY, command=f"python a.py\n{FAKE}", pool_limit_bytes=16 << 20,
                         device=DeviceInfo(f"GPU\n{FAKE}", 8 << 30, 8 << 30))
    return write_trace(path, meta, ev)


@pytest.mark.parametrize("verb", [["info"], ["analyze"], ["advise"], ["whatif", "--policies", "cupy"]])
def test_a_newline_in_trace_text_makes_no_line_of_its_own(tmp_path: Path, verb: list[str]) -> None:
    """A line break a trace holds is shown as ``\\n``: no line of the output starts with the text
    after it (it could pass for tracekit's own recommendation)."""
    path = newline_trace(tmp_path / "t.parquet")
    r = run(verb[0], path, *verb[1:])
    assert r.returncode in (0, 1), r.stderr
    lines = (r.stdout + r.stderr).decode().splitlines()
    assert not [line for line in lines if line.lstrip().startswith(FAKE)]
    if verb[0] != "whatif":  # whatif names no call-site, device or command
        assert f"\\n{FAKE}" in (r.stdout + r.stderr).decode()


def test_paths_in_paste_ready_lines_are_one_shell_word(tmp_path: Path) -> None:
    """advise's lines name the trace as a shell reads it back: quoted, never an option."""
    path = hostile_trace(tmp_path / "-my trace.parquet")
    r = subprocess.run([sys.executable, "-m", "tracekit", "advise", "./-my trace.parquet", "--limit", "4MiB"],
                       capture_output=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "tracekit replay './-my trace.parquet' --sim" in out
    assert path.exists()


@pytest.mark.parametrize("where", [".", "/", "./"])
def test_a_folder_named_as_the_trace_is_one_sentence(where: str) -> None:
    for verb in (["info"], ["analyze"], ["recover"]):
        r = run(*verb, where)
        assert r.returncode == 1 and b"Traceback" not in r.stderr, r.stderr
        assert b"is a folder" in r.stderr


def test_a_hostile_file_name_in_an_error_line(tmp_path: Path) -> None:
    r = run("info", tmp_path / "missing\x1b[2J\u202e.parquet")
    assert r.returncode == 1
    assert_escaped(r)
    assert b"missing\\x1b[2J\\u202e.parquet: no such file" in r.stderr


def test_a_dollar_in_call_sites_and_names_is_drawn(tmp_path: Path) -> None:
    path = hostile_trace(tmp_path / "ru$n.parquet")
    r = run("analyze", path, "--report", tmp_path / "a$b.html")
    assert r.returncode == 0, r.stderr
    assert_escaped(r)
    assert b"Warning" not in r.stderr  # no "Glyph 27 missing from font" with the raw character
    r = run("report", path, "-o", tmp_path / "p.html", "--png", tmp_path / "png$")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "png$").iterdir())  # the figures were drawn


@pytest.mark.filterwarnings("error::UserWarning")  # "Glyph 27 missing from font": a raw ESC was drawn
def test_a_figure_text_is_made_literal(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    from tracekit.report.render import png_bytes

    fig = Figure()
    ax = fig.add_subplot()
    ax.barh([0, 1], [1, 2])
    ax.set_yticks([0, 1], ["a$b", "c\x1bd"])
    ax.set_title("cost $5")
    fig.legend(["x$y"])
    assert png_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"  # an unmatched $ would fail the mathtext parser
    assert ax.get_title() == "cost \\$5"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a\\$b", "c\\x1bd"]
