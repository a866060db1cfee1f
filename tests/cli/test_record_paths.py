"""``record`` and ``recover`` answer bad paths in one sentence, never a traceback (as every verb does):
names and paths too long, symbolic-link loops, a read-only folder for the spool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"


def _tk(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def _one_sentence(p: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.startswith("tracekit: error: "), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p.stderr


@pytest.mark.parametrize("name", ["a" * 300 + ".py", "/x" * 2048], ids=["long-component", "long-path"])
def test_record_of_a_script_name_too_long(tmp_path: Path, name: str) -> None:
    err = _one_sentence(_tk(tmp_path, "record", name))
    assert "File name too long" in err or "no such script" in err


@pytest.mark.parametrize("name", ["b" * 300, "/y" * 2048], ids=["long-component", "long-path"])
def test_recover_of_a_name_too_long(tmp_path: Path, name: str) -> None:
    _one_sentence(_tk(tmp_path, "recover", name))


def test_symbolic_link_loops(tmp_path: Path) -> None:
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    assert "symbolic links" in _one_sentence(_tk(tmp_path, "record", "loop1"))
    _one_sentence(_tk(tmp_path, "recover", "loop1"))


def test_a_read_only_folder_for_the_spool(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a read-only tmpfs")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("this machine does not let a test mount a read-only tmpfs")
    try:
        (tmp_path / "app.py").write_text(textwrap.dedent("""
            import cupy
            a = cupy.empty(1024)
            print("ran")
        """))
        p = _tk(tmp_path, "record", "-o", str(ro / "t.parquet"), "app.py")
        err = _one_sentence(p)
        assert "Read-only file system" in err and "ran" not in p.stdout  # refused before the program runs
        p = _tk(ro, "record", str(tmp_path / "app.py"))  # the default output, in a read-only folder
        assert "Read-only file system" in _one_sentence(p)
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
