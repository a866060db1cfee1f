"""What ``replay``, ``analyze`` and ``advise`` have imported when they begin to read the trace (issue 45).

Each verb runs in a fresh process (as ``python -m tracekit``) with the first call of
``tracekit.trace.reader.open_parquet`` (every read of a trace opens it there) replaced by one that
prints the loaded modules and ends the process: the modules a verb needs only after reading must
not be among them. Not a timed test; ``scripts/bench_startup.py`` measures the seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.kernel_cache import _NoScipyForNumba

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "cupy-oom-frag.parquet"

HOOK = r"""
import json, os, runpy, sys
from importlib.abc import MetaPathFinder
from importlib.util import find_spec

class Finder(MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tracekit.trace.reader":
            return None
        sys.meta_path.remove(self)
        spec = find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            def opened(*a, **k):
                sys.stdout.write(json.dumps(sorted(sys.modules)))
                sys.stdout.flush()
                os._exit(0)
            module.open_parquet = opened
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Finder())
sys.argv = ["tracekit", *sys.argv[1:]]
runpy.run_module("tracekit", run_name="__main__", alter_sys=True)
"""

# Loaded by none of the three verbs before the trace is read. numba (and so every compiled kernel,
# and SciPy, which numba imports where it is installed) comes with the first pairing of the events;
# replay checks its policy's name and traits in the registry, which imports no kernel.
NEVER = ("scipy", "numba", "tracekit.advise.counterfactual", "matplotlib", "polars", "cupy", "torch")
KERNELS = ("tracekit.sim.prepare", "tracekit.sim.treap", "tracekit.sim.chunks", "tracekit.sim.engine")
VERBS = {
    "replay": (["replay", str(TRACE), "--sim", "best-fit"], (*NEVER, *KERNELS, "pyarrow.compute")),
    "replay-as-recorded": (["replay", str(TRACE), "--sim", "cupy", "--as-recorded"], (*NEVER, *KERNELS)),
    "analyze": (["analyze", str(TRACE)], (*NEVER, "tracekit.analysis.analyze")),
    "advise": (["advise", str(TRACE)], (*NEVER, "tracekit.advise.run", "tracekit.advise.search")),
}


def modules_at_first_read(args: list[str]) -> set[str]:
    out = subprocess.run([sys.executable, "-c", HOOK, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout, out.stderr
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_verb_reads_before_importing_what_it_needs_later(verb: str) -> None:
    args, never = VERBS[verb]
    loaded = modules_at_first_read(args)
    assert "tracekit.trace.reader" in loaded  # the hook did see the first read
    early = sorted(m for m in loaded if m.split(".")[0] in never or m in never)
    assert not early, f"{verb} imports {early} before it reads the trace"


REGISTRY = r"""
import json, sys
from tracekit.sim import policies
listed = {n: str(policies.get(n).traits.layout) for n in policies.listed()}
sys.stdout.write(json.dumps([listed, sorted(sys.modules)]))
"""


def listing() -> tuple[dict[str, str], list[str]]:
    out = subprocess.run([sys.executable, "-c", REGISTRY], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    listed, loaded = json.loads(out.stdout)
    return listed, loaded


@pytest.fixture(scope="module", autouse=True)
def indexed() -> None:
    listing()  # the registry's index written (a fresh checkout has none): what every later process reads


def test_the_registry_lists_every_policy_without_loading_a_kernel() -> None:
    # From its index (tracekit/sim/policies/__init__.py): names and traits without importing a
    # policy module, so whatever a module imports at its top, listing loads no kernel and no numba.
    listed, loaded = listing()
    assert {"best-fit", "buddy", "cupy", "torch"} <= set(listed)
    heavy = sorted(m for m in loaded if m.split(".")[0] == "numba" or m in KERNELS
                   or m.startswith("tracekit.sim.policies."))
    assert not heavy, f"listing the policies imports {heavy}"


def test_a_changed_policy_module_is_listed_from_a_new_index(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.sim import policies

    (tmp_path / "mine.py").write_text("MODEL = None\n")
    monkeypatch.setattr(policies, "_HERE", tmp_path)
    monkeypatch.setattr(policies, "_TRAIT_SOURCES", ())
    before = policies._index_path(["mine"])
    (tmp_path / "mine.py").write_text("MODEL = None  # edited\n")
    assert policies._index_path(["mine"]) != before  # the old index is never read for the new module
    (tmp_path / "other.py").write_text("MODEL = None\n")
    assert policies._index_path(["mine", "other"]) != policies._index_path(["mine"])  # a module added


def _import_as(module: str, name: str) -> None:
    exec(compile(f"import {name}", f"<{module}>", "exec"), {"__name__": module})


def test_numba_is_kept_from_scipy_and_nobody_else() -> None:
    if "scipy.linalg.cython_blas" in sys.modules:  # imported by something else: it reaches numba as usual
        pytest.skip("SciPy's BLAS is imported already in this process")
    finder = _NoScipyForNumba()
    assert finder.find_spec("scipy.linalg") is None  # asked from here (not numba): never refused
    assert finder.find_spec("numpy") is None
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        with pytest.raises(ImportError, match="tracekit keeps scipy"):
            _import_as("numba.np.arraymath", "scipy.linalg.cython_blas")  # numba's BLAS probe
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
