"""``record --torch``: a PyTorch program recorded unmodified (GPU tests need PyTorch and a CUDA device).

Without PyTorch the verb fails with one sentence and exit code 1; that part
runs everywhere PyTorch is absent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import DeviceError, OutputError, UsageError
from tracekit.record.sites import site_roots
from tracekit.record.torch import max_entries, record_torch, snapshot_path
from tracekit.trace import Op, read_trace

ROOT = Path(__file__).resolve().parents[2]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
def needs_torch(test):  # type: ignore[no-untyped-def]
    """Marked ``torch`` and skipped, saying why, where PyTorch is missing."""
    return pytest.mark.torch(pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch")(test))

PROGRAM = textwrap.dedent("""
    import sys
    import torch

    def make(n):
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    keep = [make(1 << 20) for _ in range(4)]
    tmp = make(3 << 20)
    del tmp
    print("argv", sys.argv[1:])
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "raise":
        raise ValueError("boom")
    if mode == "exit":
        sys.exit(3)
    if mode == "oom":
        free, total = torch.cuda.mem_get_info()
        torch.cuda.set_per_process_memory_fraction((256 << 20) / total)
        try:
            make(1 << 30)  # a handled OOM first
        except torch.OutOfMemoryError:
            print("handled one")
        big = [make(64 << 20) for _ in range(16)]
    if mode == "sleep":
        more = [make(2 << 20) for _ in range(3)]
        print("ready", flush=True)
        import time
        time.sleep(120)
""")


def keep_output(tmp: Path, name: str) -> None:
    dest = os.environ.get("TRACEKIT_GPU_OUT")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        for f in tmp.glob("*.p*"):
            shutil.copy(f, Path(dest) / f"{name}-{f.name}")


@pytest.mark.skipif(HAVE_TORCH, reason="checks the message shown when PyTorch is missing")
def test_without_pytorch_one_sentence(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("print('never runs')\n")
    with pytest.raises(DeviceError, match="needs PyTorch"):
        record_torch([str(script)], module=False, output=tmp_path / "t.parquet")
    r = CliRunner().invoke(app, ["record", "--torch", "-o", str(tmp_path / "t.parquet"), str(script)])
    assert r.exit_code == 1 and "needs PyTorch" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t.parquet").exists()


def run(tmp: Path, *args: str, env_extra: dict[str, str] | None = None
        ) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp / "prog.py"
    script.write_text(PROGRAM)
    out = tmp / f"rec-{args[0] if args else 'ok'}.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    r = subprocess.run([sys.executable, "-m", "tracekit", "record", "--torch", "-o", str(out), str(script),
                        *args], capture_output=True, text=True, env=env, cwd=tmp, timeout=300)
    keep_output(tmp, args[0] if args else "ok")
    return r, out


@pytest.mark.gpu
@needs_torch
def test_records_a_program(tmp_path: Path) -> None:
    r, out = run(tmp_path, "ok", "--flag")
    assert r.returncode == 0, r.stderr
    assert "argv ['ok', '--flag']" in r.stdout
    tr = read_trace(out, strict=True)
    assert tr.meta.source == "torch" and "prog.py" in (tr.meta.command or "")
    m = tr.events.op == Op.MALLOC
    sizes = tr.events.size[m].tolist()
    assert sizes.count(1 << 20) >= 4 and (3 << 20) in sizes
    sites = {tr.events.site_name(int(i)) for i in np.flatnonzero(m)}
    assert any(s and "prog.py" in s and ":make" in s for s in sites)
    assert snapshot_path(out).exists()


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize(("mode", "code"), [("raise", 1), ("exit", 3)])
def test_exit_code_and_exception_pass_through(tmp_path: Path, mode: str, code: int) -> None:
    r, out = run(tmp_path, mode)
    assert r.returncode == code, r.stderr
    if mode == "raise":
        assert "ValueError: boom" in r.stderr and "Traceback" in r.stderr
    tr = read_trace(out)
    assert np.count_nonzero(tr.events.op == Op.MALLOC) >= 5


@pytest.mark.gpu
@needs_torch
def test_out_of_memory_is_recorded_with_the_limit(tmp_path: Path) -> None:
    r, out = run(tmp_path, "oom")
    assert r.returncode == 1 and "OutOfMemoryError" in r.stderr
    tr = read_trace(out)
    assert np.count_nonzero(tr.events.op == Op.OOM) == 2  # the handled 1 GiB request, then the fatal one
    obs = tr.meta.extra["torch_oom_observer"]
    assert tr.meta.pool_limit_bytes == obs["total_or_allowed"] < tr.meta.device.total_bytes
    assert abs(tr.meta.pool_limit_bytes - (256 << 20)) < (1 << 20)
    # version 2: the device measured at each OOM, and the one the program died of
    ooms = np.flatnonzero(tr.events.op == Op.OOM)
    states = tr.meta.extra["oom_states"]
    assert "handled one" in r.stdout and len(ooms) == len(states) == 2
    assert [s["seq"] for s in states] == tr.events.seq[ooms].tolist()
    for s in states:
        assert s["mem_free"] > 0 and s["mem_total"] == tr.meta.device.total_bytes
        assert s["limits"]["stack_size"] and s["pool"]["limit_bytes"] == tr.meta.pool_limit_bytes
    ex = tr.meta.extra["exit"]
    assert ex["status"] == "exception" and ex["oom_seq"] == int(tr.events.seq[ooms[-1]])
    assert ex["exception"] == "torch.OutOfMemoryError" and ex["code"] == 1
    assert tr.meta.extra["pools"][0]["kind"] == "pool"


@pytest.mark.gpu
@needs_torch
def test_a_launcher_rank_gets_its_own_files_and_launch_metadata(tmp_path: Path) -> None:
    r, out = run(tmp_path, "ok", env_extra={"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert r.returncode == 0, r.stderr
    ranked = out.with_name("rec-ok.rank1.parquet")
    assert not out.exists() and ranked.exists() and snapshot_path(ranked).exists()
    launch = read_trace(ranked).meta.extra["launch"]
    assert (launch["rank"], launch["local_rank"], launch["world_size"]) == (1, 1, 2)


@pytest.mark.gpu
@needs_torch
def test_sigterm_dumps_the_history_and_exits_143(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = tmp_path / "stopped.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tracekit", "record", "--torch", "-o", str(out), str(script), "sleep"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line.strip() != "ready":
        pass
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    tr = read_trace(out)
    ex = tr.meta.extra["exit"]
    assert ex["status"] == "signal" and ex["signal"] == signal.SIGTERM and ex["code"] == 143
    sizes = tr.events.size[tr.events.op == Op.MALLOC].tolist()
    assert sizes.count(2 << 20) >= 3  # the history up to the stop is all there


def test_an_existing_snapshot_beside_the_trace_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("open('ran', 'w').close()\n")
    out = tmp_path / "t.parquet"
    snapshot_path(out).write_bytes(b"precious")
    with pytest.raises(OutputError, match=r"t\.pickle: already exists; choose another -o or pass --force"):
        record_torch([str(script)], module=False, output=out)
    assert snapshot_path(out).read_bytes() == b"precious" and not (tmp_path / "ran").exists()


def _outputs_case(tmp: Path, case: str) -> tuple[Path, Path, str]:
    """(script, -o, the words the refusal must say) for one way an output can be wrong."""
    script = tmp / "p.py"
    script.write_text("open('ran', 'w').close()\n")
    out = tmp / "t.parquet"
    if case == "script as trace":
        return script, script, "refusing to overwrite the input"
    if case == "link to the script as trace":
        (tmp / "link.parquet").symlink_to(script)
        return script, tmp / "link.parquet", "refusing to overwrite the input"
    if case == "script as snapshot":
        snapshot_path(out).symlink_to(script)
        return script, out, "refusing to overwrite the input"
    if case == "folder as trace":
        out.mkdir()
        return script, out, "it is a folder"
    if case == "pipe as snapshot":
        os.mkfifo(snapshot_path(out))
        return script, out, "it is a named pipe"
    return script, tmp / "nowhere" / "t.parquet", "folder"


@pytest.mark.parametrize("case", ["script as trace", "link to the script as trace", "script as snapshot",
                                  "folder as trace", "pipe as snapshot", "missing folder"])
def test_every_output_is_checked_before_the_program_runs_even_with_force(tmp_path: Path, case: str) -> None:
    script, out, words = _outputs_case(tmp_path, case)
    with pytest.raises(OutputError, match=words):
        record_torch([str(script)], module=False, output=out, force=True)
    assert script.read_text() == "open('ran', 'w').close()\n" and not (tmp_path / "ran").exists()
    r = CliRunner().invoke(app, ["record", "--torch", "--force", "-o", str(out), str(script)])
    assert r.exit_code == 1 and words in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1e6"])
def test_a_bad_max_entries_variable_is_a_usage_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_TORCH_MAX_ENTRIES", value)
    with pytest.raises(UsageError, match=f"TRACEKIT_TORCH_MAX_ENTRIES='{value}'"):
        max_entries()
    monkeypatch.setenv("TRACEKIT_TORCH_MAX_ENTRIES", "5000")
    assert max_entries() == 5000


def test_recording_writes_the_v2_keys_from_a_real_snapshot(tmp_path: Path) -> None:
    """The end of ``record --torch`` on the snapshot the GPU run left (no PyTorch needed).

    Two OOMs were observed but the history kept one ``oom`` row (as after a wrap): states
    align from the end, so the kept row gets the later state.
    """
    import gzip
    import pickle

    from tracekit.record.torch_trace import TorchEnd, write_torch_trace

    with gzip.open(ROOT / "traces" / "torch-record-oom.pickle.gz") as f:
        snap = pickle.load(f)
    program = "/tmp/pytest-of-root/pytest-0/test_out_of_memory_is_recorded0/prog.py"
    states = [{"device": 0, "mem_free": 100, "limits": {"stack_size": 1024}, "pool": {}},
              {"device": 0, "mem_free": 200, "limits": {"stack_size": 1024},
               "pool": {"limit_bytes": 256 << 20}}]
    rec = TorchEnd(tmp_path / "t.pickle", tuple(states), 0, 256 << 20, {})
    out = tmp_path / "t.parquet"
    exit_info = {"status": "exception", "exception": "torch.OutOfMemoryError", "signal": None, "code": 1,
                 "message": "CUDA out of memory", "oom_seq": None, "died_of_oom": True}
    write_torch_trace(snap, rec, out, exit_info, {"rank": 1, "local_rank": 1, "world_size": 2},
           site_roots(program))
    tr = read_trace(out, strict=True)
    oom = int(np.flatnonzero(tr.events.op == Op.OOM)[0])
    (state,) = tr.meta.extra["oom_states"]
    assert state["seq"] == oom and state["mem_free"] == 200 and state["t_ns"] == int(tr.events.t_ns[oom])
    assert tr.meta.extra["exit"]["oom_seq"] == oom and "died_of_oom" not in tr.meta.extra["exit"]
    assert tr.meta.extra["pools"] == [{"id": 0, "device": 0, "kind": "pool", "label": "caching allocator",
                                       "limit_bytes": 256 << 20}]
    assert tr.extras is not None and set(tr.extras.column("pool").to_pylist()) == {0}
    assert tr.meta.extra["launch"]["rank"] == 1 and tr.meta.schema_version == 3  # v3: whole stacks
    # call-sites relative to the program's folder, and the stacks' files too
    assert tr.events.site_name(oom) == "prog.py:6:make"
    frames = tr.events.stacks.frames(int(tr.events.stack[oom]))
    inner = next(f for f in frames if "site-packages/torch/" not in f.file)
    assert (inner.file, inner.line, inner.function) == ("prog.py", 6, "make")
    assert not any(f.file.startswith(program.rsplit("/", 1)[0]) for f in frames)


def _oom_site_after_write(tmp_path: Path, strip_frames: bool, site: str | None) -> str | None:
    """The fatal OOM's call-site in the trace ``write_torch_trace`` makes from the committed snapshot,
    with the OOM's frames removed from PyTorch's history where ``strip_frames`` (as in the GPT-2 run)."""
    import gzip
    import pickle

    from tracekit.record.torch_trace import TorchEnd, write_torch_trace

    with gzip.open(ROOT / "traces" / "torch-record-oom.pickle.gz") as f:
        snap = pickle.load(f)
    for trace in snap["device_traces"]:
        for entry in trace:
            if entry.get("action") == "oom" and strip_frames:
                entry["frames"] = []
    rec = TorchEnd(tmp_path / "t.pickle", (), 0, None, {})
    exit_info = {"status": "exception", "exception": "torch.OutOfMemoryError", "signal": None, "code": 1,
                 "message": "CUDA out of memory", "oom_seq": None, "died_of_oom": True, "site": site}
    out = tmp_path / f"t{int(strip_frames)}{int(site is None)}.parquet"
    write_torch_trace(snap, rec, out, exit_info, {}, (str(tmp_path),))
    tr = read_trace(out, strict=True)
    oom = int(np.flatnonzero(tr.events.op == Op.OOM)[-1])
    assert tr.meta.extra["exit"]["oom_seq"] == oom and tr.meta.extra["exit"]["site"] == site
    if strip_frames:  # the stack is the exception's frame too, or none
        frames = tr.events.stacks.frames(int(tr.events.stack[oom]))
        assert [f.label() for f in frames] == ([site] if site else [])
    return tr.events.site_name(oom) if tr.events.site[oom] >= 0 else None


def test_the_fatal_oom_takes_its_site_from_the_exception_only_where_the_history_has_none(
        tmp_path: Path) -> None:
    with_frames = _oom_site_after_write(tmp_path, False, "train.py:12:step")
    assert with_frames is not None and with_frames != "train.py:12:step"  # PyTorch's own frames win
    assert _oom_site_after_write(tmp_path, True, "train.py:12:step") == "train.py:12:step"
    assert _oom_site_after_write(tmp_path, True, None) is None  # no user frame: still none


class _Memory:
    """The two functions of ``torch.cuda.memory`` the view stands over, on a list of entries."""

    def __init__(self) -> None:
        self.entries: list[dict[str, object]] = []
        self.calls: list[object] = []
        self._record_memory_history = lambda enabled="all", **kw: self.calls.append(enabled)
        self._snapshot = self.snapshot

    def snapshot(self) -> dict[str, object]:
        """As PyTorch does: the history so far, and then an entry noting the snapshot."""
        out = {"segments": [], "device_traces": [list(self.entries)]}
        self.entries.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 0})
        return out

    def alloc(self, addr: int, t: int) -> None:
        self.entries.append({"action": "alloc", "addr": addr, "size": 512, "stream": 0, "time_us": t})


def test_the_programs_own_history_sees_only_its_entries_and_never_stops_tracekits() -> None:
    from tracekit.record.torch import ProgramHistory

    mem = _Memory()
    view = ProgramHistory(mem)
    view.install()
    mem.alloc(1, 10)  # before the program turns its history on
    assert mem._snapshot()["device_traces"] == [[]]
    mem._record_memory_history(max_entries=10)
    mem.alloc(2, 10)  # same microsecond as an entry before: told apart by position
    mem.alloc(3, 11)
    assert [e["addr"] for e in mem._snapshot()["device_traces"][0]] == [2, 3]  # not the mark's snapshot
    mem.alloc(4, 12)
    actions = [e["action"] for e in mem._snapshot()["device_traces"][0]]
    assert actions == ["alloc", "alloc", "snapshot", "alloc"]
    mem._record_memory_history(max_entries=2)  # on already: the same start, a shorter view
    mem.alloc(5, 13)
    mem.alloc(6, 14)
    mem.alloc(7, 15)
    assert [e["addr"] for e in mem._snapshot()["device_traces"][0]] == [6, 7]  # its max_entries
    mem._record_memory_history(enabled=None)
    assert mem._snapshot()["device_traces"] == [[]] and mem.calls == []  # tracekit's stays on
    view.uninstall()
    assert len(mem._snapshot()["device_traces"][0]) == 13  # 7 allocs and 6 snapshots, all kept
