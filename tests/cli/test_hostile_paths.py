"""Paths and disks that refuse: every verb ends with one sentence naming the file and the cause.

Each class of hostile path is built here, in the test's own folder: a folder one may not write
(chmod, or ``/sys`` where the tests run as root and chmod is not enforced), a full disk (a file
size limit, RLIMIT_FSIZE, in a child process: the write fails with EFBIG as on a full disk), a
name too long, a symbolic-link loop, a folder one may not enter and a file one may not read
(as an unprivileged user where the tests run as root), a file name that is not UTF-8, a TMPDIR
too long for the forkserver's socket, and an output that appears while the verb runs. Every run
must exit 1 (never 2, never a traceback), say ``tracekit: error: PATH: ...`` once, and leave
no temporary file behind.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tracekit.errors import OutputError
from tracekit.outputs import check_output
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.reader import read_trace
from tracekit.trace.writer import TraceWriter

NOBODY = 65534


def small_trace(path: Path) -> Path:
    """Two blocks, one freed: a valid trace of a few KB."""
    op = np.array([Op.MALLOC, Op.MALLOC, Op.FREE], np.int8)
    ev = Events.build(op, np.array([1024, 2048, 1024], np.uint64),
                      addr=np.array([4096, 8192, 4096], np.uint64), sites=("train.py:1:step",),
                      site=np.array([0, 0, -1], np.int32))
    return write_trace(path, TraceMeta.new(Source.SYNTHETIC), ev)


def snapshot(path: Path) -> Path:
    """A PyTorch snapshot of one segment and one allocation (plain data, as PyTorch writes it)."""
    import pickle

    def entry(action: str, size: int, t: int) -> dict[str, object]:
        return {"action": action, "addr": 1 << 30, "size": size, "time_us": t, "frames": [], "stream": 0}

    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [
        [entry("segment_alloc", 20 << 20, 0), entry("alloc", 1 << 20, 1)]]}))
    return path


def tracekit(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
             fsize: int | None = None, user: int | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI in a child (bytes out): under a file size limit, or as another user, if asked."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails (EFBIG), as on a full disk
        assert fsize is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    full_env = {**os.environ, **(env or {})}
    as_user = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    return subprocess.run([*as_user, sys.executable, "-m", "tracekit", *map(str, args)], capture_output=True,
                          cwd=cwd, env=full_env, preexec_fn=limit if fsize is not None else None, timeout=300)


def assert_one_sentence(r: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    """Exit 1, no traceback, one error line holding every needle; the line."""
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 1, (r.returncode, err)
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("tracekit: error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def writes(folder: Path) -> bool:
    """Whether this process can create a file in ``folder``."""
    try:
        fd, name = tempfile.mkstemp(dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A folder this process may not write into: chmod 555 where that is enforced (not root),
    else ``/sys`` (sysfs refuses new files even to root)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if not writes(folder):
            yield folder
        elif Path("/sys").is_dir() and not writes(Path("/sys")):
            yield Path("/sys")
        else:
            pytest.skip("running as root where neither chmod nor /sys refuses a new file")
    finally:
        folder.chmod(0o755)


WRITERS = {
    "synth": lambda src, snap, out: ["synth", "-p", "random", "-n", "200000", "-o", out],
    "replay": lambda src, snap, out: ["replay", src, "--sim", "first-fit", "-o", out],
    "analyze": lambda src, snap, out: ["analyze", src, "--timeline", out],
    "report": lambda src, snap, out: ["report", src, "-o", out],
    "report-png": lambda src, snap, out: ["report", src, "-o", out.with_suffix(".html"), "--png", out],
    "import": lambda src, snap, out: ["import", "torch", snap, "-o", out],
    "fleet": lambda src, snap, out: ["fleet", src, "--report", out],
    "fleet-table": lambda src, snap, out: ["fleet", src, "-o", out],
}


@pytest.mark.parametrize("verb", sorted(WRITERS))
def test_a_folder_one_may_not_write(tmp_path: Path, unwritable: Path, verb: str) -> None:
    src, snap = small_trace(tmp_path / "t.parquet"), snapshot(tmp_path / "s.pickle")
    out = unwritable / f"out-{verb}.x"
    r = tracekit(*WRITERS[verb](src, snap, out))
    line = assert_one_sentence(r, f"{out}: cannot ")  # write, or make the --png folder
    causes = ("Permission denied", "Read-only file system", "Operation not permitted")
    assert any(c in line for c in causes), line
    assert not out.exists()


@pytest.mark.parametrize("verb", sorted(set(WRITERS) - {"report-png"}))
def test_a_full_disk(tmp_path: Path, verb: str) -> None:
    # RLIMIT_FSIZE of 2 KB: the write of the output fails with EFBIG, as ENOSPC on a full disk does.
    src, snap = small_trace(tmp_path / "t.parquet"), snapshot(tmp_path / "s.pickle")
    out = tmp_path / "out" / f"{verb}.x"
    out.parent.mkdir()
    r = tracekit(*WRITERS[verb](src, snap, out), fsize=2048)
    assert_one_sentence(r, f"{out}: cannot write", "(File too large)")
    assert not out.exists()
    no_temporaries(out.parent)


def test_a_name_too_long(tmp_path: Path) -> None:
    src = small_trace(tmp_path / "t.parquet")
    long = "a" * 300
    for args in (["info", tmp_path / f"{long}.parquet"], ["analyze", tmp_path / long / "x.parquet"],
                 ["report", src, "-o", tmp_path / f"{long}.html"],
                 ["synth", "-p", "random", "-n", "10", "-o", tmp_path / long / "x.parquet"],
                 ["import", "torch", tmp_path / f"{long}.pickle"]):
        assert_one_sentence(tracekit(*args), "File name too long")
    no_temporaries(tmp_path)


def test_a_symbolic_link_loop(tmp_path: Path) -> None:
    src = small_trace(tmp_path / "t.parquet")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for args in (["info", tmp_path / "a"], ["analyze", tmp_path / "a" / "x.parquet"],
                 ["replay", src, "--sim", "cupy", "-o", tmp_path / "a"],
                 ["synth", "-p", "random", "-n", "10", "-o", tmp_path / "a" / "x.parquet"],
                 ["analyze", src, "--timeline", tmp_path / "a"]):
        assert_one_sentence(tracekit(*args), "Too many levels of symbolic links")


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Path, int | None]]:
    """A folder an unprivileged user may use, and the user to run as (None: this one is)."""
    if os.geteuid() != 0:
        yield tmp_path, None
        return
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv to run as an unprivileged user (chmod is not enforced)")
    folder = Path(tempfile.mkdtemp(prefix="tracekit-hostile-"))
    folder.chmod(0o777)
    try:
        yield folder, NOBODY
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # as root: modes do not stop the removal


def test_a_folder_one_may_not_enter_and_a_file_one_may_not_read(shared: tuple[Path, int | None]) -> None:
    folder, user = shared
    src = small_trace(folder / "t.parquet")
    closed = folder / "closed"
    closed.mkdir()
    unread = folder / "unread.parquet"
    shutil.copy(src, unread)
    env = {"HOME": str(folder), "NUMBA_CACHE_DIR": str(folder / "numba")}  # the user's own caches
    (folder / "numba").mkdir(mode=0o777)
    (folder / "numba").chmod(0o777)
    closed.chmod(0)
    unread.chmod(0)
    try:
        for args, cause in (
            (["info", closed / "x.parquet"], "closed/x.parquet: cannot read the trace (Permission denied)"),
            (["synth", "-p", "random", "-n", "10", "-o", closed / "x.parquet"],
             "cannot write (Permission denied)"),
            (["report", src, "-o", closed / "r.html"], "cannot write (Permission denied)"),
            # Unreadable input is bad input (exit 1), not bad usage (exit 2).
            (["info", unread], "unread.parquet: cannot read the trace (Permission denied)"),
            (["analyze", unread], "cannot read the trace (Permission denied)"),
            (["replay", unread, "--sim", "cupy"], "cannot read the trace (Permission denied)"),
            (["import", "torch", unread, "-o", folder / "i.parquet"], "(Permission denied)"),
            (["report", src, "--whatif-json", unread, "-o", folder / "w.html"], "(Permission denied)"),
            (["fleet", closed], "closed: cannot list the folder (Permission denied)"),
        ):
            assert_one_sentence(tracekit(*args, cwd=folder, env=env, user=user), cause)
    finally:
        closed.chmod(0o755)
        unread.chmod(0o644)


def test_a_file_name_that_is_not_utf8_is_read(tmp_path: Path) -> None:
    raw = os.fsencode(tmp_path) + b"/run\xff\x1b[2J.parquet"
    name = os.fsdecode(raw)
    shutil.copy(small_trace(tmp_path / "t.parquet"), name)
    assert len(read_trace(name).events) == 3
    r = tracekit("info", name)
    assert r.returncode == 0, r.stderr
    assert b"run\\udcff\\x1b[2J.parquet" in r.stdout  # shown escaped, as repr writes it
    assert b"\x1b" not in r.stdout and b"\xff" not in r.stdout
    out = os.fsdecode(os.fsencode(tmp_path) + b"/out\xfe.html")
    r = tracekit("report", name, "-o", out)
    assert r.returncode == 0, r.stderr
    assert Path(out).stat().st_size > 0
    assert b"\\udcfe" in r.stderr and b"\xfe" not in r.stderr  # "Wrote ..." escaped too


def test_outputs_named_in_bytes_that_are_not_utf8_are_written(tmp_path: Path) -> None:
    src, snap = small_trace(tmp_path / "t.parquet"), snapshot(tmp_path / "s.pickle")
    base = os.fsencode(tmp_path) + b"/o\xff"
    for verb in ("synth", "replay", "import", "analyze", "report"):
        out = Path(os.fsdecode(base + verb.encode() + b".x"))
        r = tracekit(*WRITERS[verb](src, snap, out))
        assert r.returncode == 0, r.stderr
        assert out.stat().st_size > 0
    assert len(read_trace(os.fsdecode(base + b"synth.x")).events) == 200000
    no_temporaries(tmp_path)


def test_a_tmpdir_too_long_for_the_forkserver_socket(tmp_path: Path) -> None:
    from tracekit.workers import process_context

    deep = tmp_path / ("d" * 100) / ("e" * 100)
    deep.mkdir(parents=True)
    one, two = small_trace(tmp_path / "t.parquet"), small_trace(tmp_path / "u.parquet")
    r = tracekit("fleet", one, two, "--jobs", "2", "--json", env={"TMPDIR": str(deep)})  # worker processes
    assert r.returncode == 0, r.stderr.decode()
    assert b"u.parquet" in r.stdout
    old = tempfile.tempdir
    try:
        tempfile.tempdir = str(deep)
        assert process_context().get_start_method() == "spawn"
        tempfile.tempdir = "/tmp"
        assert process_context().get_start_method() in ("forkserver", "spawn")
    finally:
        tempfile.tempdir = old


def test_an_output_that_appears_while_writing_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "o.parquet"
    ev = Events.build(np.array([Op.MALLOC], np.int8), np.array([512], np.uint64),
                      addr=np.array([4096], np.uint64))
    check_output(out)  # absent when checked: the commit must not replace what appears meanwhile
    w = TraceWriter(out, TraceMeta.new(Source.SYNTHETIC))
    w.write(ev)
    out.write_bytes(b"someone else's")
    with pytest.raises(OutputError, match="appeared while this command ran"):
        w.close()
    assert out.read_bytes() == b"someone else's"
    no_temporaries(tmp_path)
    check_output(out, force=True)  # with --force the file there is replaced
    with TraceWriter(out, TraceMeta.new(Source.SYNTHETIC)) as w:
        w.write(ev)
    assert len(read_trace(out).events) == 1


def test_an_output_that_appears_while_the_verb_runs_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "big.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "tracekit", "synth", "-p", "random", "-n", "3000000",
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not any(".tmp-" in p.name for p in tmp_path.iterdir()):  # the write has started
        assert proc.poll() is None and time.monotonic() < deadline, "synth ended before writing"
        time.sleep(0.01)
    out.write_bytes(b"written meanwhile")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert b"appeared while this command ran" in err and b"Traceback" not in err
    assert out.read_bytes() == b"written meanwhile"
    no_temporaries(tmp_path)


def test_outputs_are_regular_files_only_even_dev_full(tmp_path: Path) -> None:
    if not Path("/dev/full").exists() or not stat.S_ISCHR(os.stat("/dev/full").st_mode):
        pytest.skip("no /dev/full here")
    r = tracekit("synth", "-p", "random", "-n", "10", "-o", "/dev/full")
    assert_one_sentence(r, "/dev/full: cannot write, it is a device")
