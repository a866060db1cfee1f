"""Compile every compiled kernel ahead of use: run each verb once on small traces.

The hot loops are numba kernels cached on disk (``cache=True``, in the
``__pycache__`` folders beside their modules). A kernel is compiled for the
argument types a verb passes, so the surest way to have every kernel that a
verb needs compiled is to run the verbs themselves: ``synth`` each pattern,
then ``info``, ``analyze`` (with a timeline), ``replay --sim`` under every
registered policy, ``whatif``, ``report``, ``advise`` (a raw, a CuPy and a PyTorch
trace: each searches through its own inputs), ``fleet`` (its members are read
and analyzed their own way), ``export`` in both formats (a synthetic trace and a
PyTorch one with whole stacks) and ``import torch`` on the
committed snapshots, on the synthetic traces and on the small committed
traces when the source tree has them (``--traces DIR``: another folder holding
them, as when a wheel is built from a copy of the package). The package build
runs this (``setup.py``: at ``pip install -e .`` beside the sources, when a wheel
is built inside the wheel), so no verb compiles at run time afterwards; running
``python -m tracekit.cli.precompile`` again does the same for an installation
made otherwise. A verb that cannot run here (an optional dependency missing) is
reported and skipped: its kernels then compile on first use, as before.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from tracekit.sim.head_start import SWITCH

ROOT = Path(__file__).resolve().parents[2]
TRACES = ("cupy-oom-frag", "torch-wrap", "torch-expandable", "torch-record-oom", "torch-maxsplit")
SNAPSHOTS = ("torch-wrap", "torch-record-oom")
ADVISED = ("cupy-oom-frag", "torch-record-oom")  # a CuPy and a PyTorch search, both small
PATTERNS = ("training", "random", "fragmenting")
EXPORTED = ("torch-wrap",)  # a PyTorch trace with whole stacks (format 3), besides a synthetic one


def _verb(args: list[str]) -> str | None:
    """Run one verb in this process; None if it ran, else the reason it could not."""
    import typer

    from tracekit.cli.app import app

    command = typer.main.get_command(app)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = command.main(args, standalone_mode=False)
    except Exception as e:  # a verb that cannot run here must not stop the others
        return f"{type(e).__name__}: {e}"
    if code not in (0, None, 3):  # 3: a replay ran out of memory, as some traces here do
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {code}"
    return None


def _runs(tmp: Path, folder: Path) -> Iterator[list[str]]:
    from tracekit.sim import policies

    traces = []
    for pattern in PATTERNS:
        path = tmp / f"{pattern}.parquet"
        yield ["synth", "--pattern", pattern, "--events", "3000", "--seed", "1", "-o", str(path)]
        traces.append(path)
    traces += [p for p in (folder / f"{n}.parquet" for n in TRACES) if p.is_file()]
    for k, path in enumerate(traces):
        yield ["info", str(path)]
        yield ["analyze", str(path), "--timeline", str(tmp / f"timeline{k}.parquet")]
        for name in policies.names():
            yield ["replay", str(path), "--sim", name, "-o", str(tmp / f"replay{k}-{name}.parquet")]
        yield ["report", str(path), "-o", str(tmp / f"report{k}.html")]
    yield ["whatif", str(traces[0]), "--jobs", "1"]
    yield ["advise", str(traces[0]), "--jobs", "1", "--limit", "64MiB"]  # synthetic: no limit recorded
    for path in (p for p in (folder / f"{n}.parquet" for n in ADVISED) if p.is_file()):
        yield ["advise", str(path), "--jobs", "1"]
    yield ["fleet", *map(str, traces), "--jobs", "1", "-o", str(tmp / "fleet.json")]
    exported = traces[:1] + [p for p in (folder / f"{n}.parquet" for n in EXPORTED) if p.is_file()]
    for k, path in enumerate(exported):
        for fmt in ("torch-snapshot", "speedscope"):
            yield ["export", str(path), "-f", fmt, "-o", str(tmp / f"export{k}.{fmt}"), "--force"]
    for name in SNAPSHOTS:
        snap = folder / f"{name}.pickle.gz"
        if snap.is_file():
            yield ["import", "torch", str(snap), "-o", str(tmp / f"import-{name}.parquet")]


def precompile(verbose: bool = True, traces: Path | None = None) -> list[tuple[str, str]]:
    """Run every verb once (see the module docstring); the (verb, reason) pairs that could not run.

    ``traces``: the folder of committed traces (default: the source tree's ``traces/``).
    """
    failed: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tracekit-precompile-") as tmp:
        for args in _runs(Path(tmp), traces or ROOT / "traces"):
            why = _verb(args)
            if why is not None:
                failed.append((" ".join(args[:2]), why))
        # A replay begun during the read (tracekit.sim.head_start: on 4 cores or more, 1M events or
        # more): its own kernels, and the free lists' with its arrays, on a small trace here.
        with mock.patch.dict(os.environ, {SWITCH: "1"}):
            if (why := _verb(["replay", str(Path(tmp) / "random.parquet"), "--sim", "best-fit"])) is not None:
                failed.append(("replay (head start)", why))
    from tracekit.compiled import check

    if unsafe := check():  # every kernel compiled or loaded: each plain one returns no array
        raise RuntimeError("kernels that break the rules of tracekit.compiled.plain: " + "; ".join(unsafe))
    if verbose:
        print(f"tracekit: compiled the kernels in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for verb, why in failed:
            print(f"tracekit: note: {verb} did not run here ({why}); its kernels compile on first use",
                  file=sys.stderr)
    return failed


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tracekit.cli.precompile",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=None, help="folder of the committed traces")
    precompile(traces=ap.parse_args().traces)
