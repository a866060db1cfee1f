"""Shared fixtures; tests marked ``gpu`` skip with a reason where no GPU is usable."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
TRACES = ROOT / "traces"


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def traces_dir() -> Path:
    return TRACES
