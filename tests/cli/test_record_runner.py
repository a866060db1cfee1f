"""The runner runs programs as python does; the record verb's command line (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import InputError, UsageError
from tracekit.record.runner import check_target, default_output

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ("import sys\nfrom tracekit.record.runner import run_target\n"
          "o = run_target(sys.argv[2:], sys.argv[1] == 'm')\n"
          "print('OUTCOME', o.code, o.exception, o.message, flush=True)\n"
          "sys.exit(o.code)\n")

SHOW = textwrap.dedent("""
    import os, sys, threading
    print("argv", sys.argv)
    print("name", __name__)
    print("file", __file__ == os.path.abspath(__file__))
    print("path0", sys.path[0])
    print("main", sys.modules["__main__"].__dict__ is globals())
    def later():
        import time; time.sleep(0.2); print("thread done", flush=True)
    threading.Thread(target=later).start()
""")


def _run(tmp: Path, mode: str, *target: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", DRIVER, mode, *target], capture_output=True,
                          text=True, cwd=tmp, env=env, timeout=60)


def _plain(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp, timeout=60)


def test_script_sees_argv_main_file_and_path_like_python(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "show.py"
    script.write_text(SHOW)
    r = _run(tmp_path, "s", "sub/show.py", "--lr", "0.1", "-o", "x")
    plain = _plain(tmp_path, "sub/show.py", "--lr", "0.1", "-o", "x")
    assert r.returncode == 0, r.stderr
    assert r.stdout.replace("OUTCOME 0 None None\n", "") == plain.stdout
    assert "argv ['sub/show.py', '--lr', '0.1', '-o', 'x']" in r.stdout
    assert f"path0 {tmp_path / 'sub'}" in r.stdout and "main True" in r.stdout
    assert r.stdout.index("thread done") < r.stdout.index("OUTCOME")  # non-daemon threads joined


def test_module_runs_as_main_with_cwd_on_path(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text("import sys\nprint('name', __name__)\nprint('argv', sys.argv)\n"
                                 "print('path0', sys.path[0])\nsys.exit(int(sys.argv[1]))\n")
    r = _run(tmp_path, "m", "pkg.tool", "4")
    plain = _plain(tmp_path, "-m", "pkg.tool", "4")
    assert r.returncode == plain.returncode == 4
    assert f"argv ['{pkg / 'tool.py'}', '4']" in r.stdout and "name __main__" in r.stdout
    assert f"path0 {tmp_path}" in r.stdout


@pytest.mark.parametrize(("body", "code"), [
    ("import sys\nsys.exit(3)\n", 3),
    ("import sys\nsys.exit()\n", 0),
    ("import sys\nsys.exit('bad input file')\n", 1),
    ("def f():\n    raise ValueError('boom')\nf()\n", 1),
    ("raise KeyboardInterrupt\n", 130),
])
def test_exit_codes_and_messages_match_python(tmp_path: Path, body: str, code: int) -> None:
    (tmp_path / "app.py").write_text(body)
    r = _run(tmp_path, "s", "app.py")
    plain = _plain(tmp_path, "app.py")
    assert r.returncode == code
    if code != 130:  # python re-raises SIGINT for KeyboardInterrupt; tracekit exits 130
        assert plain.returncode == code
    assert r.stderr == plain.stderr  # same traceback text, no tracekit frames


def test_traceback_hides_the_recorder(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import json\njson.loads('{')\n")
    r = _run(tmp_path, "s", "app.py")
    assert r.returncode == 1 and f'File "{tmp_path / "app.py"}", line 2, in <module>' in r.stderr
    assert "tracekit" not in r.stderr and r.stderr.strip().endswith("(char 1)")


def test_check_target_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        check_target([], False)
    with pytest.raises(InputError, match="no such script"):
        check_target([str(tmp_path / "nope.py")], False)
    with pytest.raises(InputError, match="no module"):
        check_target(["no_such_module_xyz"], True)
    assert default_output(["dir/train.py", "-x"], False).name.startswith("tracekit-train-")
    assert default_output(["pkg.tool"], True).name.startswith("tracekit-pkg.tool-")


def test_record_command_line() -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["record", "--help"])
    assert r.exit_code == 0 and "--no-sites" in r.output and "--limit" in r.output
    r = runner.invoke(app, ["record", "/nonexistent/app.py", "--lr", "1"])
    assert r.exit_code == 1 and "no such script" in r.output
    r = runner.invoke(app, ["record", "--limit", "lots", "x.py"])
    assert r.exit_code == 2 and "invalid --limit 'lots'" in r.output
    r = runner.invoke(app, ["record", "--torch", "--no-sites", "x.py"])
    assert r.exit_code == 2


def test_help_imports_no_cupy() -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom tracekit.cli.app import app\n"
            "CliRunner().invoke(app, ['record', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'polars', 'torch')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_record_without_cupy_is_one_clear_error(tmp_path: Path) -> None:
    try:
        import cupy  # noqa: F401
    except Exception:  # the case under test: CuPy missing or broken
        pass
    else:
        pytest.skip("checks the message shown where CuPy is missing; CuPy is installed here")
    (tmp_path / "app.py").write_text("print('hi')\n")
    r = subprocess.run([sys.executable, "-m", "tracekit", "record", str(tmp_path / "app.py")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("tracekit: error: CuPy is not importable")
    assert not list(tmp_path.glob("tracekit-*"))
