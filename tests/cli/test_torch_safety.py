"""Untrusted and broken snapshots: nothing runs, one clear sentence, exit code 1, nothing overwritten."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import InputError, OutputError
from tracekit.importers.safe_pickle import load_pickle
from tracekit.importers.torch_snapshot import import_snapshot

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"
BAD = {
    "torch_malicious.pickle": "asks to import posix.system",
    "torch_malicious_p0.pickle": "asks to import posix.system",
    "torch_corrupt.pickle": "corrupt",
    "torch_truncated.pickle": "truncated",
    "torch_corrupt.pickle.gz": "gzip stream is corrupt",
    "torch_truncated.pickle.gz": "truncated",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_raise_one_input_error(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the malicious payload would create a file here
    with pytest.raises(InputError) as err:
        import_snapshot(DATA / name, tmp_path / "out.parquet")
    msg = str(err.value)
    assert BAD[name] in msg and str(DATA / name) in msg and "\n" not in msg
    assert not (tmp_path / "tracekit_pickle_ran").exists()
    assert not (tmp_path / "out.parquet").exists()


def test_malicious_payload_is_real(tmp_path: Path) -> None:
    # The fixture does carry a call to os.system: a plain pickle.loads would resolve it.
    import io

    class Spy(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            raise pickle.UnpicklingError(f"wanted {module}.{name}")

    data = (DATA / "torch_malicious.pickle").read_bytes()
    with pytest.raises(pickle.UnpicklingError, match=r"wanted (posix|os)\.system"):
        Spy(io.BytesIO(data)).load()


@pytest.mark.parametrize("payload", [b"", b"hello, not a pickle", b"\x80\x05\x95"])
def test_empty_and_garbage(tmp_path: Path, payload: bytes) -> None:
    p = tmp_path / "x.pickle"
    p.write_bytes(payload)
    with pytest.raises(InputError, match=str(p)):
        load_pickle(p)


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_pickle(tmp_path / "nope.pickle")
    with pytest.raises(InputError, match="folder"):
        load_pickle(tmp_path)


def test_persistent_id_is_refused(tmp_path: Path) -> None:
    import io

    class P(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return "ext" if obj == "x" else None

    buf = io.BytesIO()
    P(buf, protocol=4).dump({"segments": ["x"]})
    p = tmp_path / "pid.pickle"
    p.write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="persistent id"):
        load_pickle(p)


def test_existing_output_survives_a_failed_import(tmp_path: Path) -> None:
    out = tmp_path / "keep.parquet"
    out.write_bytes(b"precious")
    with pytest.raises(InputError):
        import_snapshot(DATA / "torch_truncated.pickle", out, force=True)
    assert out.read_bytes() == b"precious"


def test_existing_output_is_refused_unless_forced(tmp_path: Path) -> None:
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    out = tmp_path / "s.parquet"
    out.write_bytes(b"precious")
    r = CliRunner().invoke(app, ["import", "torch", str(snap)])
    assert r.exit_code == 1 and "already exists; choose another -o or pass --force" in r.output
    assert out.read_bytes() == b"precious"
    r = CliRunner().invoke(app, ["import", "torch", str(snap), "--force"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"PAR1"


def test_output_may_not_be_the_input(tmp_path: Path) -> None:
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    with pytest.raises(OutputError):
        import_snapshot(p, p)


@pytest.mark.parametrize("name", ["torch_malicious.pickle", "torch_corrupt.pickle", "torch_truncated.pickle"])
def test_cli_runner_exit_1_one_line(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["import", "torch", str(DATA / name), "-o", str(tmp_path / "o.parquet")])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and BAD[name] in lines[0]
    assert "Traceback" not in r.output and not (tmp_path / "tracekit_pickle_ran").exists()


@pytest.mark.parametrize("name", ["torch_malicious_p0.pickle", "torch_truncated.pickle.gz"])
def test_subprocess_exit_1(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "tracekit", "import", "torch", str(DATA / name), "-o",
                        str(tmp_path / "o.parquet")], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "tracekit: error:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "tracekit_pickle_ran").exists()


def test_cli_usage_error_for_missing_argument() -> None:
    r = CliRunner().invoke(app, ["import", "torch"])
    assert r.exit_code == 2
