"""``tracekit record`` over the CuPy stand-in, in a project whose ``.venv`` lies inside it: the program
puts the venv's site-packages on ``sys.path`` itself and allocates through a library there. The trace's
``environment`` holds the interpreter's folders, the library's frames are ``LIBRARY``, and ``analyze``
names the program's own line, not the library's."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from test_record_fake_cupy import FAKE, _env  # the stand-in's folder and environment (tests/cli on the path)

from tracekit.record.callstacks import tracekit_dirs
from tracekit.trace import Op, read_trace
from tracekit.trace.stacks import FrameKind

APP = """\
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), {lib!r}))
import mylib


def step():
    return mylib.make()


kept = step()
"""
MYLIB = """\
import cupy


def make():
    return cupy.empty(1000)
"""


@pytest.mark.parametrize("lib", [".venv/lib/python3.11/site-packages", "vendor/site-packages"],
                         ids=["venv-in-project", "site-packages-on-sys-path"])
def test_a_library_in_the_project_is_not_the_users_line(tmp_path: Path, lib: str) -> None:
    proj = tmp_path / "proj"
    pkg = proj / lib / "mylib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(MYLIB)
    if lib.startswith(".venv"):
        (proj / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (proj / "app.py").write_text(APP.format(lib=lib))
    r = subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", "app.py"],
                       capture_output=True, text=True, cwd=proj, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    t = read_trace(proj / "t.parquet")
    env = t.meta.environment
    assert env is not None
    assert env.prefix == os.path.abspath(sys.prefix) and env.base_prefix == os.path.abspath(sys.base_prefix)
    assert set(map(os.path.abspath, site.getsitepackages())) <= set(env.site_packages)
    assert os.path.abspath(site.getusersitepackages()) in env.site_packages
    assert os.path.abspath(sysconfig.get_paths()["stdlib"]) in env.stdlib
    assert str(FAKE / "cupy") in env.libraries and env.tracekit == tracekit_dirs()
    assert str(proj) in env.user
    assert env.venvs == ((str(proj / ".venv"),) if lib.startswith(".venv") else ())
    ev = t.events
    (i,) = np.flatnonzero(ev.op == Op.MALLOC)
    frames = ev.stacks.frames(int(ev.stack[i]))
    kinds = {(f.file, f.function): f.kind for f in frames}
    assert kinds[(f"{lib}/mylib/__init__.py", "make")] is FrameKind.LIBRARY
    assert kinds[("app.py", "step")] is kinds[("app.py", "<module>")] is FrameKind.USER
    out = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "t.parquet"], capture_output=True,
                         text=True, cwd=proj, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    still = out.stdout[out.stdout.index("still live at end"):]
    assert f"app.py:9 in step → {lib}/mylib/__init__.py:5" in still, out.stdout
    tree = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "t.parquet", "--tree"],
                          capture_output=True, text=True, cwd=proj, env=_env(), timeout=120).stdout
    starred = [line for line in tree.splitlines() if "% * " in line]
    assert starred and not any("mylib" in line or "cupy" in line for line in starred), tree


def test_record_torch_stores_the_environment_at_the_end(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of ``record --torch`` on the committed snapshot (no PyTorch needed): the same key, with
    the ``sys.path`` entries the program added, and the kinds decided on the absolute paths."""
    import gzip
    import pickle

    from tracekit.record.sites import site_roots
    from tracekit.record.torch_trace import TorchEnd, write_torch_trace

    root = Path(__file__).resolve().parents[2]
    with gzip.open(root / "traces" / "torch-record-oom.pickle.gz") as f:
        snap = pickle.load(f)
    added = tmp_path / "vendor" / "site-packages"
    monkeypatch.syspath_prepend(str(added))  # as the program left sys.path
    rec = TorchEnd(tmp_path / "t.pickle", (), 0, None, {})
    exit_info = {"status": "ok", "exception": None, "signal": None, "code": 0, "message": None,
                 "oom_seq": None, "died_of_oom": False, "site": None}
    program = "/tmp/pytest-of-root/pytest-0/test_out_of_memory_is_recorded0/prog.py"  # where it ran
    out = tmp_path / "t.parquet"
    write_torch_trace(snap, rec, out, exit_info, {}, site_roots(program))
    t = read_trace(out)
    env = t.meta.environment
    assert env is not None and str(added) in env.site_packages
    assert os.path.dirname(program) in env.user and env.prefix == os.path.abspath(sys.prefix)
    table = t.events.stacks
    kinds = {table.file[i]: FrameKind(int(k)) for i, k in enumerate(table.kind)}
    assert kinds["prog.py"] is FrameKind.USER
    torch_files = [f for f in kinds if "/torch/" in f]
    assert torch_files and all(kinds[f] is not FrameKind.USER for f in torch_files)
