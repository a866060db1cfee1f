"""PyTorch's own tools read ``tracekit export --format torch-snapshot`` files of the CuPy recordings.

``torch.cuda._memory_viz`` is what ``python -m torch.cuda._memory_viz`` runs and what builds the
MemoryViz pages (``trace_plot``, ``segment_plot``): its ``segsum`` (``stats``) asserts that each
segment's blocks add up to it, ``trace`` walks every history entry (an OOM's ``device_free``
included), and the plots embed the snapshot for MemoryViz. Needs PyTorch (marked ``torch``; skipped
where it is missing). On the GPU machine:

    python -m pytest -q -m torch tests/cli/test_export_memory_viz.py
"""

from __future__ import annotations

import base64
import importlib.util
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracekit.export.run import Format, export_file

ROOT = Path(__file__).resolve().parents[2]
CUPY = sorted((ROOT / "traces").glob("cupy-*.parquet"))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("snapshots")
    return {t.stem: export_file(t, Format.TORCH_SNAPSHOT, folder / f"{t.stem}.pickle").path for t in CUPY}


def embedded(html: str) -> Any:
    """The snapshot a MemoryViz page carries (base64 of PyTorch's own pickle of it)."""
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))  # type: ignore[union-attr]
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def test_every_committed_cupy_trace_is_exported() -> None:
    assert len(CUPY) >= 10


@pytest.mark.parametrize("name", [t.stem for t in CUPY])
def test_memory_viz_reads_the_snapshot(name: str, exported: dict[str, Path]) -> None:
    from torch.cuda import _memory_viz as viz

    with open(exported[name], "rb") as f:
        data = pickle.load(f)  # as PyTorch's tools load it
    stats = viz.segsum(data)  # asserts free + allocated == reserved, per segment and in all
    assert f"segments: {len(data['segments'])}" in stats
    history = viz.trace(data)
    assert f"{len(data['device_traces'][0])} entries" in history and "TOTAL MEM" in history
    if any(e["action"] == "oom" for e in data["device_traces"][0]):
        assert "raise OutOfMemoryError" in history  # "()" in newer PyTorch, none in 2.11
    for page in (viz.trace_plot(data), viz.trace_plot(data, plot_segments=True), viz.segment_plot(data)):
        assert "MemoryViz.js" in page and embedded(page) == data


@pytest.mark.parametrize("name", ["cupy-mlp", "cupy-oom-frag", "cupy-seed"])
def test_the_memory_viz_command_line_reads_the_snapshot(name: str, exported: dict[str, Path],
                                                        tmp_path: Path) -> None:
    def viz(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *map(str, args)],
                              capture_output=True, text=True, cwd=tmp_path)

    snap = exported[name]
    for verb in ("stats", "trace"):
        res = viz(verb, snap)
        assert res.returncode == 0 and res.stdout and "Traceback" not in res.stderr, res.stderr
    for verb in ("trace_plot", "segment_plot"):
        out = tmp_path / f"{verb}.html"
        res = viz(verb, snap, "-o", out)
        assert res.returncode == 0, res.stderr
        assert embedded(out.read_text()) == pickle.loads(snap.read_bytes())
