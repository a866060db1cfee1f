""""Library or yours": ``stacks.frame_kind`` by name and by the interpreter's folders (``Environment``),
the recorder's ``root_kinds``/``environment_now``, and the ``environment`` key through the reader."""

from __future__ import annotations

import json
import os
import site
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tracekit.errors import TraceFormatError
from tracekit.record.callstacks import CUPY_PACKAGES, environment_now, kind_of, root_kinds, tracekit_dirs
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.schema import Environment
from tracekit.trace.stacks import FrameKind, StackTable, frame_kind, guess_kind, with_kinds

U, L, S = FrameKind.USER, FrameKind.LIBRARY, FrameKind.STDLIB


@pytest.mark.parametrize(("path", "kind"), [
    ("train.py", U),
    ("model/level1.py", U),
    ("torch/nn/modules/conv.py", L),  # a one-frame PyTorch trace: relative to site-packages
    ("torchvision/models/resnet.py", L),
    ("cupy/_creation/basic.py", L),
    ("jax/_src/api.py", L),
    ("transformers/models/gpt2/modeling_gpt2.py", L),
    ("src/torch_utils/x.py", U),  # a package of the user's named like one, not one of them
    ("site-packages/mylib/__init__.py", L),
    (".venv/lib/python3.11/site-packages/mylib/__init__.py", L),
    ("venv/bin/tool", L),
    ("/usr/lib/python3/dist-packages/numpy/core.py", L),
    ("/no-such-machine/proj/.venv/bin/tool", L),  # not a folder here: the name is taken
    ("/no-such-machine/src/cupy/cupy/cuda/memory.py", L),  # a checkout on PYTHONPATH
    ("/home/a/b.py", U),
    ("<frozen runpy>", S),
    ("<string>", U),
])
def test_by_name(path: str, kind: FrameKind) -> None:
    assert frame_kind(path) is kind
    assert guess_kind(path) is kind


def test_a_recorded_kind_other_than_user_stands() -> None:
    assert frame_kind("train.py", recorded=L) is L
    assert frame_kind("torch/nn.py", recorded=FrameKind.NATIVE) is FrameKind.NATIVE


def test_virtualenvs_on_this_machine_need_pyvenv_cfg(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()  # a folder named venv that is not one: the user's package
    assert frame_kind(str(tmp_path / "venv" / "x.py")) is U
    env = tmp_path / "env"  # any name, with pyvenv.cfg: its lib/ and bin/ are not the user's
    (env / "bin").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert frame_kind(str(env / "bin" / "tool")) is L
    assert frame_kind(str(env / "app.py")) is U  # beside pyvenv.cfg: `python -m venv .` in a project
    dot = tmp_path / "proj" / ".venv"
    dot.mkdir(parents=True)
    (dot / "pyvenv.cfg").write_text("")
    assert frame_kind(str(dot / "anything.py")) is L


def proj_env(proj: str = "/proj") -> Environment:
    """The .venv-inside-the-project layout as the interpreter names it."""
    venv = f"{proj}/.venv"
    return Environment(prefix=venv, base_prefix="/usr", stdlib=("/usr/lib/python3.11",),
                       site_packages=(f"{venv}/lib/python3.11/site-packages",), libraries=(),
                       tracekit=("/opt/tk/tracekit",), venvs=(venv,), user=(proj,))


def test_folders_venv_inside_the_project() -> None:
    f = proj_env().folders()
    assert frame_kind("/proj/app.py", f) is U
    assert frame_kind("/proj/pkg/model.py", f) is U
    assert frame_kind("/proj/.venv/lib/python3.11/site-packages/x.py", f) is L
    assert frame_kind("/proj/.venv/bin/runner", f) is L  # the prefix, more specific than /proj
    assert frame_kind("/usr/lib/python3.11/json/__init__.py", f) is S
    assert frame_kind("/usr/share/thing.py", f) is L  # under base_prefix, no user's folder more specific
    assert frame_kind("/opt/tk/tracekit/record/hook.py", f) is L
    assert frame_kind("/elsewhere/x.py", f) is U
    assert frame_kind("app.py", f) is U  # relative: by name only


def test_folders_the_program_inside_the_prefix_stays_the_users() -> None:
    env = Environment(prefix="/usr/local", base_prefix="/usr/local", stdlib=("/usr/local/lib/python3.11",),
                      site_packages=("/usr/local/lib/python3.11/site-packages",), user=("/usr/local/app",))
    f = env.folders()
    assert frame_kind("/usr/local/app/train.py", f) is U
    assert frame_kind("/usr/local/bin/tool.py", f) is L
    assert frame_kind("/usr/local/lib/python3.11/site-packages/x.py", f) is L
    assert frame_kind("/usr/local/lib/python3.11/os.py", f) is S
    # site-packages wins even over a user's folder more specific than it
    inside = Environment(site_packages=("/v/site-packages",), user=("/v/site-packages/pkg",)).folders()
    assert frame_kind("/v/site-packages/pkg/tool.py", inside) is L


def test_folders_a_listed_folder_needs_no_library_name() -> None:
    env = Environment(libraries=("/opt/vendor/kit",), user=("/work",))
    assert frame_kind("/opt/vendor/kit/alloc.py") is U  # by name: nothing says library
    assert frame_kind("/opt/vendor/kit/alloc.py", env.folders()) is L
    assert frame_kind("/opt/vendor/kitchen/x.py", env.folders()) is U  # a folder, not a prefix of names


def test_folders_leave_out_the_root_and_relative_folders() -> None:
    env = Environment(prefix="/", base_prefix="relative", user=("/work",))
    assert [f for f, _ in env.folders()] == ["/work/"]


def test_names_apply_below_the_users_folder_only() -> None:
    """A user's folder named like an array library (a project in /home/a/torch) stays the user's."""
    f = Environment(user=("/home/a/torch",)).folders()
    assert frame_kind("/home/a/torch/train.py", f) is U
    assert frame_kind("/home/a/torch/torch/nn.py", f) is L  # a torch checkout inside it
    assert frame_kind("/home/a/torch/site-packages/m.py", f) is L


def test_with_kinds_changes_only_user_frames_and_keeps_an_unchanged_table() -> None:
    t = StackTable.build(["app.py", "torch/nn.py", "x.cpp", "train.py"], [1, 2, 3, 4], ["a", "b", "c", "d"],
                         [U, U, FrameKind.NATIVE, L], range(4), [-1, 0, 1, 2])
    got = with_kinds(t)
    assert got.kind.tolist() == [U, L, FrameKind.NATIVE, L]  # a LIBRARY frame is never made USER
    same = StackTable.build(["app.py"], [1], ["a"], [U], [0], [-1])
    assert with_kinds(same) is same


def test_environment_json_round_trip_and_checks() -> None:
    env = proj_env()
    assert Environment.from_json(json.loads(json.dumps(env.to_json()))) == env
    assert Environment.from_json({"user": ["/a"], "added_later": 1}) == Environment(user=("/a",))
    for bad in ([], {"user": "/a"}, {"user": [1]}, {"prefix": 3}, {"venvs": ["/x"] * 5000},
                {"stdlib": ["a" * 20000]}):
        with pytest.raises(ValueError):
            Environment.from_json(bad)


def _trace(path: Path, files: list[str], env: Environment | None, raw_env: object = None) -> Path:
    t = StackTable.build(files, range(1, len(files) + 1), ["f"] * len(files), [U] * len(files),
                         range(len(files)), [-1, *range(len(files) - 1)])
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC])
    ev = Events.build(op, np.array([2 << 20, 1 << 20], np.uint64), addr=np.array([1 << 32] * 2, np.uint64),
                      rounded=np.array([2 << 20, 1 << 20], np.uint64), site=np.full(2, -1, np.int32),
                      stack=np.array([-1, len(files) - 1], np.int32), stacks=t)
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("X", 1 << 30, 1 << 30), environment=env)
    if raw_env is not None:
        meta = meta.with_extra(environment=raw_env)  # written as given: to_dict's extra comes last
    return write_trace(path, meta, ev)


def test_the_reader_parses_the_key_once_and_classifies_with_it(tmp_path: Path) -> None:
    files = ["/work/app.py", "/opt/vendor/kit/alloc.py"]
    env = Environment(prefix="/usr", base_prefix="/usr", libraries=("/opt/vendor/kit",), user=("/work",))
    t = read_trace(_trace(tmp_path / "e.parquet", files, env))
    assert t.meta.environment == env
    assert t.meta.to_dict()["environment"]["libraries"] == ["/opt/vendor/kit"]
    assert t.events.stacks.kind.tolist() == [U, L]
    old = read_trace(_trace(tmp_path / "o.parquet", files, None))  # no key: by name, the vendor's is USER
    assert old.meta.environment is None and "environment" not in old.meta.to_dict()
    assert old.events.stacks.kind.tolist() == [U, U]


def test_a_malformed_key_is_a_format_error(tmp_path: Path) -> None:
    p = _trace(tmp_path / "bad.parquet", ["/work/app.py"], None, raw_env={"user": "not a list"})
    with pytest.raises(TraceFormatError, match=r"environment\.user"):
        read_trace(p)


def test_environment_now_holds_what_the_interpreter_says(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj"
    venv = proj / ".venv"
    added = venv / "lib" / "python3.11" / "site-packages"
    added.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("")
    monkeypatch.syspath_prepend(str(added))  # a program's own sys.path entry
    env = environment_now((str(proj), *site.getsitepackages()), ("numpy", "no_such_package_here"))
    assert env.prefix == os.path.abspath(sys.prefix) and env.base_prefix == os.path.abspath(sys.base_prefix)
    assert set(map(os.path.abspath, site.getsitepackages())) <= set(env.site_packages)
    assert os.path.abspath(site.getusersitepackages()) in env.site_packages
    assert str(added) in env.site_packages
    assert os.path.abspath(sysconfig.get_paths()["stdlib"]) in env.stdlib
    assert env.libraries == (os.path.dirname(np.__file__),)
    assert env.tracekit == tracekit_dirs()
    assert env.venvs == (str(venv),) and env.user == (str(proj),)  # the site-packages root is not the user's


def test_record_time_kinds_read_the_same_folders(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / ".venv").mkdir(parents=True)
    (proj / ".venv" / "pyvenv.cfg").write_text("")
    kinds = root_kinds((str(proj),), CUPY_PACKAGES)
    assert kinds == environment_now((str(proj),), CUPY_PACKAGES).folders()
    assert kind_of(str(proj / "app.py"), kinds) is U
    assert kind_of(str(proj / ".venv" / "lib" / "python3.11" / "site-packages" / "mylib" / "__init__.py"),
                   kinds) is L
    assert kind_of(str(proj / "site-packages" / "mylib.py"), kinds) is L  # put on sys.path by the program
    assert kind_of(os.__file__, kinds) is S
    assert kind_of(str(Path(tracekit_dirs()[0]) / "record" / "hook.py"), kinds) is L
