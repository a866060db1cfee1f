""""Library or yours" is one answer in every verb: ``analyze`` (labels, still live, the OOM), ``analyze
--tree`` (its ``*``), ``advise``, ``report`` and ``fleet``, on tiny hand-built traces: the
``.venv``-inside-the-project layout an older recorder marked as the user's, a one-frame PyTorch trace
with paths relative to site-packages, a folder the ``environment`` metadata names, ``--user-code``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.schema import Environment
from tracekit.trace.stacks import FrameKind, StackTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_page_model import read_model  # the JSON model embedded in a written page

MiB = 1 << 20
runner = CliRunner()
U = FrameKind.USER
S0 = 0x7F00_0000_0000


def trace_of(path: Path, frames: list[tuple[str, int, str]], env: Environment | None = None) -> Path:
    """One chain of ``frames`` (outermost first, all recorded ``USER``, as an older recorder or importer
    may have stored them): an 8 MiB segment, 2 and 3 MiB live at the innermost frame, never freed, then
    a 4 MiB request there fails."""
    n = len(frames)
    table = StackTable.build([f[0] for f in frames], [f[1] for f in frames], [f[2] for f in frames],
                             [U] * n, range(n), [-1, *range(n - 1)])
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.OOM])
    size = np.array([8, 2, 3, 4], np.uint64) * MiB
    ev = Events.build(op, size, addr=np.array([S0, S0, S0 + 2 * MiB, 0], np.uint64), rounded=size,
                      site=np.full(4, -1, np.int32), stack=np.array([-1, n - 1, n - 1, n - 1], np.int32),
                      stacks=table)
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=8 * MiB, device=DeviceInfo("X", 80 << 30, 79 << 30),
                         environment=env)
    return write_trace(path, meta, ev)


def one_frame_trace(path: Path, sites: tuple[str, ...]) -> Path:
    """A format-2 style trace: call-sites only (one frame each), one 1 MiB block live at each, the last
    site's 8 MiB request failing."""
    k = len(sites)
    op = np.array([Op.SEGMENT_ALLOC, *[Op.MALLOC] * k, Op.OOM])
    size = np.array([k, *[1] * k, 8], np.uint64) * MiB
    addr = np.array([S0, *(S0 + i * MiB for i in range(k)), 0], np.uint64)
    site = np.array([-1, *range(k), k - 1], np.int32)
    ev = Events.build(op, size, addr=addr, rounded=size, site=site, sites=sites)
    return write_trace(path, TraceMeta.new(Source.TORCH, device=DeviceInfo("X", 80 << 30, 79 << 30)), ev)


def invoke(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def analyze_json(trace: Path, *extra: str) -> dict[str, Any]:
    return dict(json.loads(invoke("analyze", str(trace), "--json", "--tree", *extra)))


def tree_nodes(node: dict[str, Any]) -> list[tuple[str, bool]]:
    out = [(node["frame"], node["user"])] if "frame" in node else []
    for c in node.get("children", []):
        out += tree_nodes(c)
    return out


def marked(text: str) -> list[str]:
    """The frames ``analyze --tree`` marks ``*`` (your code)."""
    return [line.split("* ", 1)[1].strip() for line in text.splitlines() if "% * " in line]


def report_frames(trace: Path, tmp: Path, *extra: str) -> tuple[list[str], list[bool], list[str]]:
    out = tmp / f"{trace.stem}{len(extra)}.html"
    invoke("report", str(trace), "-o", str(out), *extra)
    f = read_model(out)["frames"]
    return f["file"], f["user"], [f["kinds"][k] for k in f["kind"]]


def every_verb(trace: Path, tmp: Path, *extra: str) -> dict[str, Any]:
    """The user's line as each verb names it, and which frames each calls the user's."""
    d = analyze_json(trace, *extra)
    adv = json.loads(invoke("advise", str(trace), "--json", "--jobs", "1", *extra))
    files, user, kinds = report_frames(trace, tmp, *extra)
    tree = [n for n in tree_nodes(d["trees"]["never_freed"]) if n[1]]
    got = {"oom": d["oom"]["user_site"], "leak": d["leaks"][0]["user_site"],
           "advise": adv["top_sites_at_peak"][0]["user_site"], "tree_user": [n[0] for n in tree],
           "report_user": [f for f, u in zip(files, user, strict=True) if u],
           "report_kinds": dict(zip(files, kinds, strict=True)),
           "text": invoke("analyze", str(trace), "--tree", *extra)}
    pytest.importorskip("polars")
    (row,) = json.loads(invoke("fleet", str(trace), "--json", "--jobs", "1", *extra))["rows"]
    got["fleet"] = row["oom_user_site"]
    return got


@pytest.mark.parametrize("lib", [".venv/lib/python3.11/site-packages", "site-packages"],
                         ids=["venv-in-project", "site-packages-in-program-folder"])
def test_a_library_inside_the_project_is_not_the_users(tmp_path: Path, lib: str) -> None:
    frames = [("app.py", 9, "<module>"), ("app.py", 5, "step"), (f"{lib}/mylib/__init__.py", 3, "make"),
              (f"{lib}/cupy/_creation/basic.py", 22, "empty")]
    got = every_verb(trace_of(tmp_path / "v.parquet", frames), tmp_path)
    assert got["oom"] == got["leak"] == got["advise"] == got["fleet"] == "app.py:5:step"
    assert got["tree_user"] == ["app.py:9 in <module>", "app.py:5 in step"]
    assert got["report_user"] == ["app.py", "app.py"]
    assert got["report_kinds"][f"{lib}/mylib/__init__.py"] == "library"
    text = got["text"]
    assert f"app.py:5 in step → {lib}/mylib/__init__.py:3" in text  # the "still live" line
    assert marked(text) and not any("site-packages" in m for m in marked(text))


def test_a_one_frame_torch_trace_names_no_torch_frame_as_the_users(tmp_path: Path) -> None:
    sites = ("torch/nn/modules/conv.py:549:_conv_forward", "torchvision/models/resnet.py:151:forward",
             "torch/_tensor.py:40:__deepcopy__", "train.py:88:step")
    trace = one_frame_trace(tmp_path / "t.parquet", sites)
    d = analyze_json(trace)
    users = {x["site"]: x["user_site"] for x in d["leaks"]}
    assert users == {"torch/nn/modules/conv.py:549:_conv_forward": None,
                     "torchvision/models/resnet.py:151:forward": None,
                     "torch/_tensor.py:40:__deepcopy__": None, "train.py:88:step": "train.py:88:step"}
    files, user, kinds = report_frames(trace, tmp_path)
    assert [f for f, u in zip(files, user, strict=True) if u] == ["train.py"]
    assert [k for f, k in zip(files, kinds, strict=True) if f != "train.py"] == ["library"] * 3
    assert set(marked(invoke("analyze", str(trace), "--tree"))) == {"train.py:88 in step"}  # each tree


def test_a_folder_the_metadata_lists_is_a_library_without_the_name(tmp_path: Path) -> None:
    frames = [("/work/app.py", 9, "<module>"), ("/work/app.py", 5, "step"),
              ("/opt/vendor/kit/alloc.py", 30, "alloc")]
    plain = every_verb(trace_of(tmp_path / "plain.parquet", frames), tmp_path)
    assert plain["oom"] == plain["advise"] == "/opt/vendor/kit/alloc.py:30:alloc"  # by name: nothing says so
    env = Environment(prefix="/usr", base_prefix="/usr", stdlib=("/usr/lib/python3.11",),
                      libraries=("/opt/vendor/kit",), user=("/work",))
    got = every_verb(trace_of(tmp_path / "env.parquet", frames, env), tmp_path)
    assert got["oom"] == got["leak"] == got["advise"] == got["fleet"] == "/work/app.py:5:step"
    assert got["tree_user"] == ["/work/app.py:9 in <module>", "/work/app.py:5 in step"]
    assert got["report_kinds"]["/opt/vendor/kit/alloc.py"] == "library"
    assert not any("vendor" in m for m in marked(got["text"]))


def test_the_venv_prefix_inside_the_project_is_not_the_users_folder(tmp_path: Path) -> None:
    """sys.prefix = /proj/.venv, the program in /proj: app.py is the user's, the venv's files are not."""
    frames = [("/proj/.venv/bin/runner", 8, "<module>"), ("/proj/app.py", 5, "step"),
              ("/proj/.venv/lib/python3.11/site-packages/mylib/__init__.py", 3, "make")]
    env = Environment(prefix="/proj/.venv", base_prefix="/usr",
                      site_packages=("/proj/.venv/lib/python3.11/site-packages",), user=("/proj",))
    got = every_verb(trace_of(tmp_path / "p.parquet", frames, env), tmp_path)
    assert got["oom"] == got["advise"] == got["fleet"] == "/proj/app.py:5:step"
    assert got["tree_user"] == ["/proj/app.py:5 in step"]


def test_user_code_overrides_everything(tmp_path: Path) -> None:
    lib = ".venv/lib/python3.11/site-packages"
    frames = [("app.py", 9, "<module>"), ("app.py", 5, "step"), (f"{lib}/mylib/__init__.py", 3, "make")]
    trace = trace_of(tmp_path / "v.parquet", frames)
    got = every_verb(trace, tmp_path, "--user-code", f"{lib}/mylib")
    assert got["oom"] == got["leak"] == got["advise"] == got["fleet"] == f"{lib}/mylib/__init__.py:3:make"
    assert got["tree_user"] == [f"{lib}/mylib/__init__.py:3 in make"]
    assert got["report_user"] == [f"{lib}/mylib/__init__.py"]
    env_frames = [("/work/app.py", 5, "step"), ("/opt/vendor/kit/alloc.py", 30, "alloc")]
    env = Environment(libraries=("/opt/vendor/kit",), user=("/work",))
    d = analyze_json(trace_of(tmp_path / "e.parquet", env_frames, env), "--user-code", "/opt/vendor/kit")
    assert d["oom"]["user_site"] == "/opt/vendor/kit/alloc.py:30:alloc"
