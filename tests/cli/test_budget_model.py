"""The budget equation as plain arithmetic, with the figures measured on an H200 (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tracekit.budget.measure import BUDGET_KEYS
from tracekit.budget.model import (
    How,
    budget_terms,
    cross_checks,
    format_table,
    local_memory_model,
    terms_add_up,
)
from tracekit.budget.report import render_text

MiB = 1 << 20


def h200(**kw: Any) -> dict[str, Any]:
    """The cheap budget of an idle H200 (CuPy 14.2, driver 580.159), as measured there."""
    b = {k: None for k in BUDGET_KEYS}
    b.update(
        device=0, name="NVIDIA H200", nvml=True, context_existed=False,
        nvml_total=150_754_820_096, nvml_reserved=644_939_776, nvml_used_before=0,
        nvml_free_before=150_109_880_320, other_processes_bytes=0, other_processes=[],
        cuda_total=150_109_880_320, cuda_free=149_557_477_376, context_bytes=552_402_944,
        context_and_others_bytes=552_402_944, nvml_used_after=552_402_944,
        stack_size=1024, printf_fifo_size=8_650_752, malloc_heap_size=8_388_608,
        sm_count=132, max_threads_per_sm=2048, local_memory_model_bytes=276_824_064,
        cupy_pool_total_bytes=0, cupy_pool_used_bytes=0,
    )
    b.update(kw)
    return b


def _term(terms: list, name: str) -> Any:
    return next(t for t in terms if t.name.strip() == name)


def test_local_memory_model() -> None:
    # 1 KiB default stack x 2048 threads/SM x 132 SMs = 264 MiB
    assert local_memory_model(1024, 2048, 132) == 264 * MiB
    # 16 KiB: 4,224 MiB predicted; the H200 took 3,960 MiB (15/16 of it) at launch
    assert local_memory_model(16384, 2048, 132) == 4224 * MiB


def test_terms_of_an_idle_h200_add_up_exactly() -> None:
    terms = budget_terms(h200())
    assert _term(terms, "board total").bytes == 150_754_820_096
    assert _term(terms, "driver/firmware reservation").bytes == 644_939_776
    assert _term(terms, "this process's context").bytes == 552_402_944
    assert _term(terms, "free").bytes == 149_557_477_376
    assert _term(terms, "unaccounted").bytes == 0
    assert terms_add_up(terms)
    # the context breakdown: 264 + 8 + 8.25 MiB estimated, the rest derived
    rest = _term(terms, "code, constants, driver (rest)")
    assert rest.bytes == 552_402_944 - 264 * MiB - 8_388_608 - 8_650_752
    assert rest.how == How.DERIVED and rest.part_of == "this process's context"
    assert _term(terms, "local memory (model)").how == How.ESTIMATED


def test_parts_are_not_added_twice() -> None:
    terms = budget_terms(h200())
    top = [t for t in terms[1:] if t.part_of is None and t.name != "unaccounted"]
    assert sum(t.bytes for t in top) == terms[0].bytes


def test_a_kernel_reservation_and_a_pool_are_their_own_terms() -> None:
    kept = 3960 * MiB + 2 * MiB
    b = h200(kernel_local={"kept_bytes": kept, "local_bytes": 16384},
             cupy_pool_total_bytes=64 * MiB,
             final={"cuda_free": 149_557_477_376 - kept - 64 * MiB})
    terms = budget_terms(b)
    assert _term(terms, "kernel module + local memory").bytes == kept
    assert _term(terms, "user allocations (CuPy pool)").bytes == 64 * MiB
    assert terms_add_up(terms)


def test_drift_beyond_the_granularity_is_reported() -> None:
    terms = budget_terms(h200(cuda_free=149_557_477_376 - 3 * MiB))
    assert _term(terms, "unaccounted").bytes == 3 * MiB
    assert not terms_add_up(terms)
    assert terms_add_up(terms, tolerance=4 * MiB)


def test_without_nvml_the_context_is_lumped_and_marked() -> None:
    b = h200(nvml_total=None, nvml_reserved=None, nvml_used_before=None, nvml_free_before=None,
             other_processes_bytes=None, context_bytes=None, nvml=False)
    terms = budget_terms(b)
    assert terms[0].how == How.DERIVED and terms[0].bytes == 150_109_880_320
    assert _term(terms, "driver/firmware reservation").how == How.UNAVAILABLE
    lump = _term(terms, "context + other processes")
    assert lump.bytes == 552_402_944 and lump.how == How.DERIVED
    assert terms_add_up(terms)


def test_cross_checks_on_the_h200() -> None:
    b = h200(probe={"largest": {"largest": 145_399_691_253, "free": 145_403_019_264}})
    checks = cross_checks(b, budget_terms(b))
    assert [c.ok for c in checks] == [True, True, True, True]
    bad = cross_checks(h200(nvml_used_after=600_000_000), budget_terms(h200()))
    assert not bad[1].ok and bad[1].left - bad[1].right == 600_000_000 - 552_402_944


def test_table_and_text() -> None:
    terms = budget_terms(h200())
    table = format_table(terms)
    assert "150,754,820,096" in table and "measured" in table and "estimated" in table
    b = h200(kernel_local={"local_bytes": 16384, "local_size_bytes": 16384, "grid": 2112, "block": 128,
                           "load_bytes": 2 * MiB, "launch_bytes": 3960 * MiB, "kept_bytes": 3962 * MiB,
                           "model_bytes": 4224 * MiB, "launch_over_model": 0.9375,
                           "stack_size_before": 1024, "stack_size_after": 16384,
                           "restore_gave_back": 3960 * MiB})
    text = render_text(b, budget_terms(b), cross_checks(b, budget_terms(b)))
    assert "launch 3,960.00 MiB" in text and "1,024 -> 16,384 B" in text


def _has_cupy() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(_has_cupy(), reason="checks the message on a machine without CuPy")
def test_budget_without_a_gpu_fails_in_one_line() -> None:
    p = subprocess.run([sys.executable, "-m", "tracekit", "budget"], capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.startswith("tracekit: error: CuPy is not importable")
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("args,match", [(["--device", "-1"], "device ordinal"),
                                        (["--kernel-local-bytes", "0"], "--kernel-local-bytes must be")])
def test_budget_bad_arguments_exit_2(args: list[str], match: str) -> None:
    p = subprocess.run([sys.executable, "-m", "tracekit", "budget", *args], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert match in p.stderr


class _Runtime:
    """A stand-in for cupy.cuda.runtime whose third cudaMalloc fails."""

    class CUDARuntimeError(Exception):
        pass

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.calls = 0

    def memGetInfo(self) -> tuple[int, int]:
        return (1 << 30) - (2 << 20) * len(self.taken), 1 << 30

    def malloc(self, size: int) -> int:
        self.calls += 1
        if self.calls == 3:
            raise self.CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
        p = 0x1000_0000 * self.calls
        self.taken.add(p)
        return p

    def free(self, p: int) -> None:
        self.taken.remove(p)


def test_granularity_frees_what_it_took_when_a_malloc_fails() -> None:
    from tracekit.budget.probe import measure_cost
    from tracekit.errors import DeviceError

    rt = _Runtime()
    assert measure_cost(rt, 512, 2) == (4 << 20, [0x1000_0000, 0x2000_0000]) and not rt.taken
    rt = _Runtime()
    with pytest.raises(DeviceError, match="cudaMalloc of 512 bytes failed"):
        measure_cost(rt, 512, 4)
    assert not rt.taken
