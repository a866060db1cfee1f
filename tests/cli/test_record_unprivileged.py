"""As a user without root's powers: a read-only install, no writable home, folders without permission.

Runs as ``nobody`` (``su``) with the system's Python of the same version and this venv's packages on
its path (the venv's own interpreter lies under root's home, which ``nobody`` may not enter), so
tracekit's folder and its compiled kernels' cache are not writable and ``~`` does not exist: every
verb answers in one sentence or works, never a traceback (``tracekit.kernel_cache``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"
SYSTEM_PY = "/usr/bin/python3"


def _why_not() -> str | None:
    if os.geteuid() != 0 or shutil.which("su") is None:
        return "needs root (to become nobody with su)"
    if not os.path.exists(SYSTEM_PY):
        return f"needs {SYSTEM_PY} (the venv's interpreter may lie where nobody cannot enter)"
    v = subprocess.run([SYSTEM_PY, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                       text=True).stdout.strip()
    if v != str(tuple(sys.version_info[:2])):
        return f"{SYSTEM_PY} is Python {v}, the venv's packages are for {sys.version_info[:2]}"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def _as_nobody(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), str(FAKE), sysconfig.get_paths()["purelib"]])
    cmd = f"cd {folder} && HOME=/nonexistent PYTHONPATH={path} {SYSTEM_PY} -m tracekit " + " ".join(args)
    return subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", cmd], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def open_folder():  # type: ignore[no-untyped-def]
    """A folder nobody may enter and write (pytest's own lies under a folder only root may enter)."""
    folder = Path(tempfile.mkdtemp(prefix="tracekit-nobody-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_record_and_analyze_work_and_refusals_are_one_sentence(open_folder: Path) -> None:
    tmp_path = open_folder
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import cupy
        a = [cupy.empty(1 << 20) for _ in range(3)]
    """))
    (tmp_path / "ro").mkdir(mode=0o555)
    (tmp_path / "ro").chmod(0o555)
    p = _as_nobody(tmp_path, "record", "-o", "ro/t.parquet", "app.py")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "Permission denied" in p.stderr
    p = _as_nobody(tmp_path, "record", "-o", "t.parquet", "app.py")  # kernels compile into /tmp
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = _as_nobody(tmp_path, "analyze", "t.parquet")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    secret = tmp_path / "secret.parquet.spool"
    secret.write_bytes(b"x")
    secret.chmod(0o600)
    p = _as_nobody(tmp_path, "recover", str(secret))
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "Permission denied" in p.stderr


def _refused(p: subprocess.CompletedProcess[str], says: str) -> None:
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("tracekit: error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert says in p.stderr and "ran" not in p.stdout, p.stderr


@pytest.fixture
def folders(open_folder: Path) -> Path:
    """``open_folder`` with a script, a folder nobody may enter (000), one nobody may not write in (555)
    holding a script and a spool, a script and a package only root may read, and a spool."""
    program = "import cupy\na = cupy.empty(1024)\nprint('ran')\n"
    (open_folder / "app.py").write_text(program)
    for name, mode in (("shut", 0o000), ("ro", 0o555)):
        (open_folder / name).mkdir()
        if name == "ro":
            (open_folder / name / "app.py").write_text(program)
            (open_folder / name / "k.parquet.spool").write_bytes(b"x")
        (open_folder / name).chmod(mode)
    (open_folder / "secret.py").write_text(program)
    (open_folder / "secret.py").chmod(0o600)
    (open_folder / "pkg").mkdir()
    (open_folder / "pkg" / "__main__.py").write_text(program)
    (open_folder / "pkg" / "__main__.py").chmod(0o600)
    (open_folder / "k.parquet.spool").write_bytes(b"x")
    (open_folder / "k.parquet.spool").chmod(0o644)
    return open_folder


@pytest.mark.parametrize("where, args, says", [
    ("", ("record", "-o", "shut/t.parquet", "app.py"), "shut/t.parquet: cannot write (Permission denied)"),
    ("", ("record", "secret.py"), "secret.py: cannot read the script (Permission denied)"),
    ("", ("record", "pkg"), "pkg/__main__.py: cannot read the script (Permission denied)"),
    ("", ("record", "shut/app.py"), "shut/app.py: cannot read the script (Permission denied)"),
    ("ro", ("record", "app.py"), "cannot write (Permission denied)"),  # the default output, here
    ("", ("recover", "shut/t.parquet"), "cannot read the spool (Permission denied)"),
    ("", ("recover", "-o", "shut/x.parquet", "k.parquet.spool"), "shut/x.parquet: cannot write (Permission"),
    ("", ("recover", "-o", "ro/x.parquet", "k.parquet.spool"), "ro/x.parquet: cannot write (Permission"),
    ("", ("recover", "ro/k.parquet.spool"), "ro/k.parquet: cannot write (Permission"),  # the default output
], ids=["record-output-folder-000", "record-unreadable-script", "record-unreadable-package",
        "record-script-in-folder-000", "record-default-output-in-read-only-cwd",
        "recover-spool-in-folder-000", "recover-output-folder-000", "recover-output-folder-555",
        "recover-default-output-in-folder-555"])
def test_folders_and_files_without_permission_are_one_sentence(folders: Path, where: str,
                                                              args: tuple[str, ...], says: str) -> None:
    """Refused before the program runs (nothing printed by it), in one sentence, exit 1."""
    _refused(_as_nobody(folders / where, *args), says)
