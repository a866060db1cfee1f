"""``export --format speedscope``: the moments of a trace as sampled profiles in bytes.

Every file is validated against speedscope's own JSON schema (vendored in tests/data with its
licence note), and the byte totals of a hand-built trace are worked out here by hand:

    row  event                                   live after (bytes)
    0    malloc 0x1000  1000 B (1024)  weights     1024
    1    malloc 0x2000  3000 B (3072)  activations 4096
    2    malloc 0x4000  4096 B (4096)  temporary   8192
    3    free   0x4000                             4096
    4    malloc 0x5000  5000 B (5120)  activations 9216   <- the peak
    5    oom    1 MiB                  temporary          handled (row 7 allocates after it)
    6    free   0x2000                             6144
    7    malloc 0x8000   512 B (512)   (no site)   6656
    8    oom    2 MiB                  weights            fatal (nothing allocated after it)

peak = weights 1024 + activations 3072 + 5120 = 9216; handled OOM (before row 5) = the same 9216;
fatal OOM (before row 8) = weights 1024 + activations 5120 + no site 512 = 6656; never freed = the
same 6656; all allocated = 1024 + (3072 + 5120) + 4096 + 512 = 13824.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit.analysis import analyze_trace
from tracekit.export import speedscope
from tracekit.export.moments import Moment, MomentKind, Selection, select
from tracekit.export.run import Format, export_file
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.stacks import FrameKind, StackTable

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the dev extra's")

SITES = ("model/a.py:10:weights", "model/b.py:20:activations", "model/c.py:30:temporary")
MiB = 1 << 20
ROWS = [  # op, addr, size, rounded, site
    (Op.MALLOC, 0x1000, 1000, 1024, 0),
    (Op.MALLOC, 0x2000, 3000, 3072, 1),
    (Op.MALLOC, 0x4000, 4096, 4096, 2),
    (Op.FREE, 0x4000, 4096, 0, -1),
    (Op.MALLOC, 0x5000, 5000, 5120, 1),
    (Op.OOM, 0, MiB, MiB, 2),
    (Op.FREE, 0x2000, 3072, 0, -1),
    (Op.MALLOC, 0x8000, 512, 512, -1),
    (Op.OOM, 0, 2 * MiB, 2 * MiB, 0),
]


def write_rows(path: Path, rows: list[tuple[int, int, int, int, int]],
               sites: tuple[str, ...] = SITES) -> Path:
    op, addr, size, rounded, site = (np.array(c) for c in zip(*rows, strict=True))
    ev = Events.build(op=op, size=size, addr=addr, rounded=rounded, site=site,
                      t_ns=np.arange(len(op)) * 1000, sites=sites)
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), ev)
    return path


@pytest.fixture(scope="module")
def schema() -> jsonschema.Draft7Validator:
    path = Path(__file__).resolve().parents[1] / "data" / "speedscope-file-format-schema.json"
    return jsonschema.Draft7Validator(json.loads(path.read_text()))


def exported(trace: Path, out: Path) -> dict[str, Any]:
    export_file(trace, Format.SPEEDSCOPE, out)
    doc: dict[str, Any] = json.loads(out.read_bytes())
    return doc


def by_leaf(doc: dict[str, Any], profile: dict[str, Any]) -> dict[str, int]:
    """A profile's bytes by its samples' innermost frame's function (a name is ``function (file:line)``)."""
    frames = doc["shared"]["frames"]
    out: dict[str, int] = {}
    for sample, weight in zip(profile["samples"], profile["weights"], strict=True):
        name = frames[sample[-1]]["name"].split(" (", 1)[0]
        out[name] = out.get(name, 0) + weight
    return out


def test_the_worked_totals_of_the_hand_built_trace(tmp_path: Path,
                                                   schema: jsonschema.Draft7Validator) -> None:
    doc = exported(write_rows(tmp_path / "t.parquet", ROWS), tmp_path / "t.json")
    schema.validate(doc)
    titles = [p["name"] for p in doc["profiles"]]
    assert titles == ["live at the peak, seq 4", "live at the fatal OOM, seq 8",
                      "live at the handled OOM, seq 5", "never freed", "all bytes allocated"]
    assert doc["activeProfileIndex"] == 1  # the fatal OOM opens first
    peak, fatal, handled, never, allocated = doc["profiles"]
    assert by_leaf(doc, peak) == {"weights": 1024, "activations": 8192}
    assert by_leaf(doc, handled) == by_leaf(doc, peak)
    assert by_leaf(doc, fatal) == {"weights": 1024, "activations": 5120, "<no call-site>": 512}
    assert by_leaf(doc, never) == by_leaf(doc, fatal)
    assert by_leaf(doc, allocated) == {"weights": 1024, "activations": 8192, "temporary": 4096,
                                       "<no call-site>": 512}
    for p, total in zip(doc["profiles"], (9216, 6656, 9216, 6656, 13824), strict=True):
        assert (p["type"], p["unit"], p["startValue"], p["endValue"]) == ("sampled", "bytes", 0, total)
        assert sum(p["weights"]) == total
    assert {"name": "weights (model/a.py:10)", "file": "model/a.py", "line": 10} in doc["shared"]["frames"]
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"


def test_samples_run_from_the_root_to_the_leaf_and_share_frames() -> None:
    table = StackTable.build(
        ["train.py", "model.py", "lib.py"], [5, 10, 99], ["main", "forward", "alloc"],
        [FrameKind.USER, FrameKind.USER, FrameKind.LIBRARY],
        frame=[0, 1, 2, 2], parent=[-1, 0, 1, 0],
    )
    m = Moment(MomentKind.PEAK, "peak", 0, 0, np.array([2, 3], np.int32), np.array([4096, 512], np.uint64),
               np.array([1, 1], np.int64))
    doc = speedscope.document(Selection((m,), table, 0), "t", "tracekit")
    names = [f["name"] for f in doc["shared"]["frames"]]  # type: ignore[index]
    samples = doc["profiles"][0]["samples"]  # type: ignore[index]
    main, forward, alloc = "main (train.py:5)", "forward (model.py:10)", "alloc (lib.py:99)"
    assert [[names[i] for i in s] for s in samples] == [[main, forward, alloc], [main, alloc]]
    assert samples[0][-1] == samples[1][-1] and sorted(names) == sorted([alloc, forward, main])


def test_ooms_beyond_the_bound_are_counted_the_fatal_one_kept(tmp_path: Path,
                                                              schema: jsonschema.Draft7Validator) -> None:
    rows = [(Op.MALLOC, 0x1000, 512, 512, 0)]
    rows += [(Op.OOM, 0, MiB + i * 512, MiB + i * 512, 1) for i in range(20)]  # each followed by a malloc
    rows += [(Op.MALLOC, 0x2000 + i * 512, 512, 512, 0) for i in range(1)]
    rows += [(Op.OOM, 0, 8 * MiB, 8 * MiB, 2)]  # the last: fatal
    path = write_rows(tmp_path / "many.parquet", rows)
    sel = select(read_trace(path))
    kinds = [m.kind for m in sel.moments]
    assert kinds.count(MomentKind.FATAL_OOM) == 1 and kinds.count(MomentKind.HANDLED_OOM) == 15
    assert sel.omitted_ooms == 5
    assert [m.seq for m in sel.moments if m.kind is MomentKind.HANDLED_OOM] == list(range(1, 16))
    doc = exported(path, tmp_path / "many.json")
    schema.validate(doc)
    assert doc["name"] == "many.parquet (5 more handled OOMs not exported)"


def test_a_trace_that_holds_nothing_exports_empty_profiles(tmp_path: Path,
                                                           schema: jsonschema.Draft7Validator) -> None:
    path = write_rows(tmp_path / "none.parquet", [(Op.OOM, 0, MiB, MiB, 0)])
    doc = exported(path, tmp_path / "none.json")
    schema.validate(doc)
    assert [(p["name"], p["endValue"]) for p in doc["profiles"]] == [
        ("live at the fatal OOM, seq 0", 0), ("never freed", 0), ("all bytes allocated", 0)]


def test_a_profile_per_device_peak_and_the_ooms_on_their_own_device(tmp_path: Path) -> None:
    op = np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.MALLOC, Op.OOM])
    ev = Events.build(op=op, size=np.array([1024, 4096, 1024, 2048, MiB]),
                      rounded=np.array([1024, 4096, 0, 2048, MiB]),
                      addr=np.array([0x1000, 0x1000, 0x1000, 0x9000, 0]),
                      device=np.array([0, 1, 0, 0, 1]), site=np.array([0, 1, -1, 2, 0]), sites=SITES)
    path = tmp_path / "two.parquet"
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), ev)
    sel = select(read_trace(path))
    got = [(m.title, m.device, m.total) for m in sel.moments]
    assert got == [("live at the peak, seq 3, device 0", 0, 2048),
                   ("live at the peak, seq 1, device 1", 1, 4096),
                   ("live at the fatal OOM, seq 4, device 1", 1, 4096),
                   ("never freed", None, 6144), ("all bytes allocated", None, 7168)]


COMMITTED = ["cupy-mlp", "cupy-fft", "cupy-oom-frag", "cupy-seed", "cupy-user-pool", "torch-handled-oom",
             "torch-oom"]


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_traces_validate_and_the_peak_is_the_analyzers(name: str, traces_dir: Path, tmp_path: Path,
                                                                 schema: jsonschema.Draft7Validator) -> None:
    trace = read_trace(traces_dir / f"{name}.parquet")
    doc = exported(traces_dir / f"{name}.parquet", tmp_path / "x.json")
    schema.validate(doc)
    summary = analyze_trace(trace, timeline=False).summary
    peak = doc["profiles"][0]
    assert peak["name"].startswith("live at the peak") and peak["endValue"] == summary.peak_live_bytes
    never = next(p for p in doc["profiles"] if p["name"] == "never freed")
    assert never["endValue"] == summary.leaked_bytes
    allocated = doc["profiles"][-1]
    assert allocated["endValue"] == int(trace.events.rounded[trace.events.op == Op.MALLOC].sum())
    ooms = [p for p in doc["profiles"] if "OOM" in p["name"]]
    assert len(ooms) == min(trace.events.count(Op.OOM), 16)


def test_whole_stacks_become_samples_from_the_root(tmp_path: Path,
                                                   schema: jsonschema.Draft7Validator) -> None:
    """A trace with whole call stacks (format v3): every sample is its stack's frames, outermost first."""
    from tracekit.synth import Pattern, synthesize

    path = synthesize(Pattern.TRAINING, 4000, 7, tmp_path / "deep.parquet", stacks=40)
    trace = read_trace(path)
    ev = trace.events
    assert int(ev.stacks.parent.max()) >= 0  # stacks deeper than one frame
    doc = exported(path, tmp_path / "deep.json")
    schema.validate(doc)
    frames = doc["shared"]["frames"]
    sel = select(trace)
    for m, prof in zip(sel.moments, doc["profiles"], strict=True):
        for s, sample, weight in zip(m.stack.tolist(), prof["samples"], prof["weights"], strict=True):
            want = [(f"{f.function} ({f.file}:{f.line})" if f.line >= 0 else f"{f.function} ({f.file})",
                     f.file) for f in reversed(ev.stacks.frames(s))] if s >= 0 else [("<no call-site>", None)]
            assert [(frames[i]["name"], frames[i].get("file")) for i in sample] == want
            assert weight == int(m.bytes[m.stack.tolist().index(s)])
    assert max(len(s) for p in doc["profiles"] for s in p["samples"]) > 1
    assert doc["profiles"][0]["endValue"] == analyze_trace(trace, timeline=False).summary.peak_live_bytes
