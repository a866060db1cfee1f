"""Shared fixtures; tests marked ``gpu`` skip with a reason where no GPU is usable."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
TRACES = ROOT / "traces"
LAYOUT = ("unit", "cli", "gpu", "fidelity", "browser")  # tests by what they are; see pyproject's markers

# Hand-built traces are shared between test modules (``from test_analysis_ooms import trace_of``)
# across these folders: every folder is importable, whichever module runs alone or first.
for _folder in LAYOUT:
    _path = str(Path(__file__).resolve().parent / _folder)
    if _path not in sys.path:
        sys.path.append(_path)


# CI (CI=true) draws the same Hypothesis examples every run, so a submission's result does not
# depend on the draw; elsewhere the draws are random and a failure prints how to reproduce it.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


@functools.cache
def gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device is usable ({e})"
    return None if n > 0 else "no CUDA device present"


@functools.cache
def watcher_unavailable_reason() -> str | None:
    """Why the recorder's watcher cannot run here (it holds a pidfd of the recorded process)."""
    import os

    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as e:
        return f"the watcher needs pidfd_open (Linux 5.3+, Python 3.9+): {type(e).__name__}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))
        if "watcher" in item.keywords and watcher_unavailable_reason() is not None:
            item.add_marker(pytest.mark.skip(reason=str(watcher_unavailable_reason())))


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def traces_dir() -> Path:
    return TRACES


@pytest.fixture(scope="module")
def rmm_fidelity_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The committed RMM logs of ``traces/fidelity/rmm.json``'s programs, imported: name -> trace path."""
    import json

    from tracekit.importers.rmm_log import import_log

    out = tmp_path_factory.mktemp("rmm")
    record = json.loads((TRACES / "fidelity" / "rmm.json").read_text())
    return {p["name"]: import_log(TRACES / p["log"], out / f"{p['name']}.parquet").path
            for p in record["programs"]}
