"""A program that makes its own file at the trace's output: kept as it is, the trace beside it.

``tracekit record -o t.parquet app.py`` of a program that writes ``t.parquet`` itself while it runs (a
file, a folder, a symbolic link to a file, to a folder, to nothing), then ends normally, by
``os._exit`` or by SIGKILL: the program's file is byte for byte what it made (no link followed), the
trace is at the first free name beside it (``t.1.parquet``, or ``t.2.parquet`` where the program made
``t.1.parquet`` too) with every malloc the program made, its metadata names the output the program
took, no spool is left, the exit status is the program's, and one sentence on the terminal says where
the trace went, whoever finished it (the recorder, or its watcher after the process died). The
shared choice of that name (``tracekit.record.final``) is checked on its own below.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracekit.errors import OutputError
from tracekit.record.fastpath import COMPILED
from tracekit.record.final import Keep, sibling, write_final
from tracekit.trace import Op, read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"
USER = b"the program's own results\n" * 40

MAKE = {
    "file": "open('t.parquet', 'wb').write(USER)",
    "folder": "os.mkdir('t.parquet'); open('t.parquet/inside', 'wb').write(USER)",
    "link to a file": "open('victim', 'wb').write(USER); os.symlink('victim', 't.parquet')",
    "link to nothing": "os.symlink('nowhere', 't.parquet')",
    "link to a folder": "os.mkdir('vdir'); os.symlink('vdir', 't.parquet')",
}
ENDS = {
    "normal": ("pass", 0),
    "os._exit": ("os._exit(3)", 3),
    "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
}
PROGRAM = """
    import json, os, signal, sys, time
    import cupy
    USER = {user!r}
    keep = [cupy.empty(1 << 20) for _ in range(20)]
    time.sleep(0.8)  # past the flush interval: these rows are in the spool
    {make}
    more = [cupy.empty(1 << 20) for _ in range(3)]  # in the program's memory and the tail only
    print("allocated", flush=True)
    {end}
"""
ALL = 23


def _record(tmp: Path, make: str, end: str, *opts: str) -> subprocess.CompletedProcess[str]:
    (tmp / "app.py").write_text(textwrap.dedent(PROGRAM.format(user=USER, make=make, end=end)))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    return subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", *opts, "app.py"],
                          capture_output=True, text=True, cwd=tmp, env=env, timeout=120)


def _state(folder: Path, skip: set[str]) -> dict[str, tuple[str, bytes | str]]:
    """Every name below ``folder`` but ``skip``: a link's target text, a file's bytes, a folder."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if rel.split("/")[0] in skip:
            continue
        out[rel] = ("link", os.readlink(p)) if p.is_symlink() else ("folder", "") if p.is_dir() \
            else ("file", p.read_bytes())
    return out


def _made_by_program(tmp: Path, make: str) -> dict[str, tuple[str, bytes | str]]:
    """What ``make`` leaves in a folder of its own, without tracekit."""
    ref = tmp / "ref"
    ref.mkdir()
    subprocess.run([sys.executable, "-c", f"import os\nUSER = {USER!r}\n{make}"], cwd=ref, check=True)
    return _state(ref, set())


def _check(tmp: Path, p: subprocess.CompletedProcess[str], make: str, code: int, trace: str) -> None:
    assert p.returncode == code, p.stderr
    assert "allocated" in p.stdout and "Traceback" not in p.stderr
    want = _made_by_program(tmp, make)
    assert _state(tmp, {"app.py", "ref", trace}) == want  # the program's file untouched, nothing else left
    t = read_trace(tmp / trace, strict=True)
    mallocs = int((t.events.op == Op.MALLOC).sum())
    assert mallocs == ALL if COMPILED or code == 0 else mallocs >= 20
    assert t.meta.extra["output_taken"] == str(tmp / "t.parquet")
    assert not list(tmp.glob("*.spool*")) and not list(tmp.glob("*.finishing"))
    assert (f"tracekit: the program wrote its own file at t.parquet (kept as it is), so the trace is at "
            f"{trace}") in p.stderr


@pytest.mark.watcher
@pytest.mark.parametrize("end", list(ENDS))
@pytest.mark.parametrize("kind", list(MAKE))
def test_the_programs_file_is_kept_and_the_trace_is_beside_it(tmp_path: Path, kind: str, end: str) -> None:
    code, status = ENDS[end]
    p = _record(tmp_path, MAKE[kind], code)
    _check(tmp_path, p, MAKE[kind], status, "t.1.parquet")
    if end != "normal":  # the watcher finished it: the recorded process was gone
        assert read_trace(tmp_path / "t.1.parquet").meta.extra["finished_by"] == "watcher"
    else:
        assert "Wrote t.1.parquet" in p.stderr


def test_a_sibling_name_the_program_took_too_is_skipped(tmp_path: Path) -> None:
    make = "open('t.parquet', 'wb').write(USER); open('t.1.parquet', 'wb').write(USER)"
    p = _record(tmp_path, make, "sys.exit(5)")
    _check(tmp_path, p, make, 5, "t.2.parquet")


@pytest.mark.watcher
def test_a_program_that_broke_the_finishing_code_still_gets_the_trace_beside_its_file(tmp_path: Path) -> None:
    """The recorded process asks the watcher to finish (``json.dumps = None``): the watcher answers
    where the trace went, and record says it."""
    make = MAKE["file"]
    p = _record(tmp_path, make, "json.dumps = None; json.loads = None")
    _check(tmp_path, p, make, 0, "t.1.parquet")
    assert read_trace(tmp_path / "t.1.parquet").meta.extra["finished_by"] == "watcher"
    assert "Wrote t.1.parquet" in p.stderr


def test_force_replaces_the_old_trace_but_never_the_file_the_program_made(tmp_path: Path) -> None:
    (tmp_path / "t.parquet").write_bytes(b"an old trace")
    p = _record(tmp_path, "pass", "pass", "--force")  # the file there at the start: --force replaces it
    assert p.returncode == 0 and "Wrote t.parquet" in p.stderr and "own file" not in p.stderr, p.stderr
    assert int((read_trace(tmp_path / "t.parquet").events.op == Op.MALLOC).sum()) == ALL
    # the program replaces the old trace with its own file: that one is kept
    make = "os.unlink('t.parquet'); open('t.parquet', 'wb').write(USER)"
    p = _record(tmp_path, make, "pass", "--force")
    _check(tmp_path, p, make.split("; ", 1)[1], 0, "t.1.parquet")


def test_sibling_names() -> None:
    assert sibling(Path("/d/out.parquet"), 1) == Path("/d/out.1.parquet")
    assert sibling(Path("/d/out.tar.parquet"), 12) == Path("/d/out.tar.12.parquet")
    assert sibling(Path("/d/trace"), 2) == Path("/d/trace.2")
    long = sibling(Path("/d/" + "é" * 127 + ".parquet"), 3)  # 254 + 8 bytes: the base is cut
    assert len(os.fsencode(long.name)) <= 255 and long.name.endswith("é.3.parquet")


def test_write_final_takes_the_output_where_it_is_free(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    got = write_final(out, lambda path, more: path.write_bytes(repr(more).encode()))
    assert got == out and out.read_bytes() == b"{}"


def test_write_final_moves_on_where_a_name_is_taken_while_the_trace_is_written(tmp_path: Path) -> None:
    """The commit never replaces: a name another process takes during the write sends the trace to
    the next name, through the one atomic writer (``tracekit.outputs``, ``link(2)``)."""
    from tracekit.outputs import atomic_output

    out = tmp_path / "t.parquet"
    out.write_bytes(b"mine")
    tried = []

    def write(path: Path, more: dict[str, object]) -> None:
        tried.append(path.name)
        with atomic_output(path) as f:
            f.write(b"trace " + str(more["output_taken"]).encode())
            if path.name == "t.1.parquet":
                (tmp_path / "t.1.parquet").write_bytes(b"theirs")  # taken meanwhile

    assert write_final(out, write) == tmp_path / "t.2.parquet"
    assert tried == ["t.1.parquet", "t.2.parquet"]
    assert out.read_bytes() == b"mine" and (tmp_path / "t.1.parquet").read_bytes() == b"theirs"
    assert (tmp_path / "t.2.parquet").read_bytes() == f"trace {out}".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.1.parquet", "t.2.parquet", "t.parquet"]


def test_write_final_raises_a_failure_that_is_not_a_name_taken(tmp_path: Path) -> None:
    def write(path: Path, more: dict[str, object]) -> None:
        raise OutputError(f"{path}: cannot write (No space left on device)")

    with pytest.raises(OutputError, match="No space left"):
        write_final(tmp_path / "t.parquet", write)


def test_keep_names_only_the_file_there_at_the_start(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    assert Keep.at_start(out, force=True) is None
    out.write_bytes(b"old")
    assert Keep.at_start(out, force=False) is None
    keep = Keep.at_start(out, force=True)
    assert keep is not None and Keep.parse(keep.text()) == keep and Keep.parse("-") is None
    assert write_final(out, lambda path, more: path.write_bytes(b"new"), keep) == out  # may replace it
    out.unlink()
    out.write_bytes(b"another")  # a new file at the name (maybe with the same inode): not the one named
    got = write_final(out, lambda path, more: path.write_bytes(b"new"), keep)
    assert got == tmp_path / "t.1.parquet" and out.read_bytes() == b"another"
