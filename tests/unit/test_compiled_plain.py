"""``tracekit.compiled.plain``: kernels compiled without numba's reference counting. The check
that names a plain function returning an array (the package's precompile step runs it) is shown to
find one and pass a clean one; numba's own refusals (a plain function making an array, or taking
one a compiled function made) are shown to hold; and the kernels replayed here break no rule. The
answers the kernels give are held by the simulator's tests as before (C++ best fit, CuPy's pool,
PyTorch's allocator, the frozen advise answers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from tracekit.compiled import check

MODULE = '''
import numpy as np
from numba import njit
from tracekit.compiled import plain

@njit(cache=True)
def made(n):
    return np.zeros(n, np.int64)

@plain
def hands_back(a):
    return a

@plain
def takes_made(n):
    b = made(n)
    return b.shape[0]

@plain
def clean(T, roots, i):
    x = roots[i]
    return T[x, 0] if x >= 0 else -1
'''


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "plain_cases.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("plain_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["plain_cases"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("plain_cases", None)


def test_the_check_names_a_plain_function_that_returns_an_array(kernels) -> None:  # type: ignore[no-untyped-def]
    a = np.arange(4)
    assert kernels.hands_back(a) is not None
    assert kernels.clean(np.arange(6).reshape(3, 2), np.array([2, -1]), 0) == 4
    found = [line for line in check() if line.startswith("plain_cases.")]
    assert any(line.startswith("plain_cases.hands_back returns array(int64") for line in found), found
    assert not any(line.startswith("plain_cases.clean") for line in found), found


def test_numba_refuses_a_plain_function_an_array_a_compiled_function_made(kernels) -> None:  # type: ignore[no-untyped-def]
    from numba.core.errors import TypingError

    with pytest.raises(TypingError):
        kernels.takes_made(3)


def test_a_plain_function_that_makes_an_array_does_not_compile(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from numba.core.errors import TypingError

    from tracekit.compiled import plain

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))

    def makes(n):  # type: ignore[no-untyped-def]
        return np.empty(n).shape[0]

    with pytest.raises(TypingError):
        plain(makes)(3)


def test_the_kernels_compiled_here_break_no_rule() -> None:
    """Whatever this process compiled or loaded so far (the replays below at least): signatures
    loaded from the cache show their results only; the precompile step sees their calls too."""
    from tracekit.sim import policies
    from tracekit.sim.base import SimConfig
    from tracekit.sim.engine import replay
    from tracekit.trace.reader import read_trace

    trace = read_trace(Path(__file__).resolve().parents[2] / "traces" / "cupy-oom-frag.parquet")
    for name in policies.names():
        replay(trace, name, SimConfig(capacity=None))
    assert [line for line in check() if not line.startswith("plain_cases.")] == []
