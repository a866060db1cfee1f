"""The one output policy: regular files only, never an input, never an existing file without --force,
no temporary file left behind on any way out a process can catch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit import outputs
from tracekit.cli.app import app
from tracekit.errors import OutputError

ROOT = Path(__file__).resolve().parents[2]


def test_device_nodes_pipes_and_folders_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target, word in (("/dev/null", "a device"), (fifo, "a named pipe"), (tmp_path, "a folder")):
        with pytest.raises(OutputError, match=word):
            outputs.check_output(target, force=True)
        with pytest.raises(OutputError, match=word):
            outputs.write_bytes(target, b"x")
    assert fifo.exists() and not fifo.is_file()


def test_an_input_is_refused_under_any_name(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    src.write_bytes(b"data")
    (tmp_path / "sub").mkdir()
    os.link(src, tmp_path / "hard")
    os.symlink(src, tmp_path / "soft")
    for name in (tmp_path / "hard", tmp_path / "soft", tmp_path / "sub" / ".." / "in.parquet"):
        with pytest.raises(OutputError, match="refusing to overwrite the input"):
            outputs.check_output(name, (src,), force=True)
    assert src.read_bytes() == b"data"


def test_existing_files_need_force_and_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "o.bin"
    out.write_bytes(b"old")
    with pytest.raises(OutputError, match=r"already exists.*--force"):
        outputs.check_output(out)
    outputs.check_output(out, force=True)
    with pytest.raises(RuntimeError), outputs.atomic_output(out) as f:
        f.write(b"half")
        raise RuntimeError
    assert out.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["o.bin"]
    outputs.write_bytes(out, b"new")
    assert out.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["o.bin"]


def test_leftovers_of_a_killed_process_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f".o.bin.tmp-{dead.stdout.strip()}"
    stale.write_bytes(b"junk")
    outputs.write_bytes(tmp_path / "o.bin", b"x")
    assert sorted(os.listdir(tmp_path)) == ["o.bin"]


@pytest.mark.parametrize("verb", [
    ["synth", "-p", "random", "-n", "10"],
])
def test_cli_refuses_existing_output_without_force(tmp_path: Path, verb: list[str]) -> None:
    out = tmp_path / "t.parquet"
    out.write_bytes(b"mine")
    r = CliRunner().invoke(app, [*verb, "-o", str(out)])
    assert r.exit_code == 1 and "already exists" in r.output and out.read_bytes() == b"mine"
    r = CliRunner().invoke(app, [*verb, "-o", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() != b"mine"


def test_usage_errors_are_one_line() -> None:
    for args in (["nosuch"], ["info", "--bogus", "x"], ["synth", "-p", "random", "-n", "1e20", "-o", "x"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), r.output


def default_signals() -> None:
    """In the child: Ctrl-C as in a terminal, even when this test runs as a background job
    (a shell starts those with SIGINT ignored, and Python keeps an inherited SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_synth_with_its_code_one_line_and_no_leftovers(tmp_path: Path, sig: int,
                                                                     code: int) -> None:
    out = tmp_path / "big.parquet"
    cmd = [sys.executable, "-X", "faulthandler", "-m", "tracekit.cli.app", "synth", "-p", "random",
           "-n", "200000000", "-o", str(out)]
    p = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)
    deadline = time.monotonic() + 60
    while not any(n.startswith(".big.parquet.tmp-") for n in os.listdir(tmp_path)):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(sig)
    try:
        _, stderr = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # show where it hangs
        p.send_signal(signal.SIGABRT)
        pytest.fail(f"no exit 60 s after the signal: {p.communicate()[1][-4000:]}")
    assert p.returncode == code, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert os.listdir(tmp_path) == []


def test_a_failed_verb_leaves_no_claim_on_its_output(tmp_path: Path) -> None:
    """A verb that checked an output and then failed must not stop a later --force run in this process
    from replacing it (the output checks end with the verb)."""
    from typer.testing import CliRunner

    from tracekit.cli.app import app

    out, bad = tmp_path / "r.html", tmp_path / "bad.parquet"
    bad.write_bytes(b"not a trace")
    r = CliRunner().invoke(app, ["analyze", str(bad), "--report", str(out)])
    assert r.exit_code == 1
    out.write_text("old")
    src = tmp_path / "ok.parquet"
    assert CliRunner().invoke(app, ["synth", "-p", "random", "-n", "100", "-o", str(src)]).exit_code == 0
    r = CliRunner().invoke(app, ["analyze", str(src), "--report", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert out.read_text() != "old"
