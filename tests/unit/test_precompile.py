"""The build's compile step runs real verbs: every one it names exists, and every policy is replayed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tracekit.cli.app import app
from tracekit.cli.precompile import ROOT, TRACES, _runs
from tracekit.sim import policies


def test_every_step_is_a_verb_and_every_policy_is_replayed(tmp_path: Path) -> None:
    runs = list(_runs(tmp_path, ROOT / "traces"))
    group = typer.main.get_command(app)
    verbs = set(group.commands)  # type: ignore[attr-defined]
    assert {r[0] for r in runs} <= verbs
    steps = {"synth", "analyze", "replay", "whatif", "report", "advise", "fleet", "export"}
    assert steps <= {r[0] for r in runs}
    replayed = {r[r.index("--sim") + 1] for r in runs if r[0] == "replay"}
    assert replayed == set(policies.names())


def test_the_committed_traces_come_from_the_folder_given(tmp_path: Path) -> None:
    # A wheel is built from a copy of the package, away from traces/: the build names the folder.
    named = {Path(r[1]).stem for r in _runs(tmp_path, ROOT / "traces") if r[0] == "info"}
    assert set(TRACES) <= named
    elsewhere = {Path(r[1]).stem for r in _runs(tmp_path, tmp_path / "none") if r[0] == "info"}
    assert not set(TRACES) & elsewhere and {"training", "random", "fragmenting"} <= elsewhere


# The install's compile step, then a user's first export, each in a fresh process sharing one fresh
# numba cache: every kernel the export runs was compiled by the step (found in the cache), none at
# run time (a cache miss is a compile).
STEP = """
import sys
from pathlib import Path
from tracekit.cli.precompile import ROOT, _runs, _verb
for args in _runs(Path(sys.argv[1]), ROOT / "traces"):
    if args[0] in ("synth", "export"):  # export reads a synthetic trace the step makes first
        assert _verb(args) is None, args
"""

FIRST_USE = """
import sys
import numpy as np
from numba.core.registry import CPUDispatcher
from tracekit.cli.precompile import _verb
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.stacks import StackTable
n = 5000  # one chain deeper than the frames an export writes per stack
table = StackTable.build(["a.py", "b.py"], [1, 2], ["f", "g"], [0, 0], np.arange(n) % 2, np.arange(n) - 1)
ev = Events.build(np.array([Op.MALLOC, Op.MALLOC]), np.array([512, 512]), addr=np.array([4096, 8192]),
                  stack=np.array([n - 1, 7], np.int32), stacks=table)
deep = write_trace(sys.argv[1] + "/deep.parquet", TraceMeta.new(Source.SYNTHETIC), ev)
for path in (deep, "traces/cupy-mlp.parquet"):
    for fmt in ("torch-snapshot", "speedscope"):
        assert _verb(["export", str(path), "-f", fmt, "-o", sys.argv[1] + "/out." + fmt, "--force"]) is None
hits = misses = 0
for name, mod in list(sys.modules.items()):
    for key, v in vars(mod).items() if name.startswith("tracekit") else ():
        if isinstance(v, CPUDispatcher):
            hits += sum(v.stats.cache_hits.values())
            if v.stats.cache_misses:
                print(f"compiled: {name}.{key}")
            misses += sum(v.stats.cache_misses.values())
print(hits, misses)
"""


@pytest.mark.slow
def test_a_fresh_export_compiles_nothing_after_the_step(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(script: str) -> str:
        p = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=900)
        assert p.returncode == 0, p.stderr
        return p.stdout

    run(STEP)
    *compiled, last = run(FIRST_USE).splitlines()
    hits, misses = map(int, last.split())
    assert compiled == [] and misses == 0 and hits > 0
