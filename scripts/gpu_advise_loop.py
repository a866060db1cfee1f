"""On a GPU: follow advise's own instructions on a run that died, round after round, until the
program completes or advise names nothing (docs/fidelity.md, "The loop advise asked for").

    python3 scripts/gpu_advise_loop.py OUT [--start TRACE ...] [--rounds 3] [--steps 8]

Where nothing fits a recording that ended at its failing request, ``advise`` names a setting and the
capacity at which it fits with the margin, says the check holds through the failing request only,
and asks for the run to be recorded again there and advised on again. This does exactly that for
``scripts/torch_workload_resnet.py`` (torchvision's ResNet-50, AMP, ``cudnn.benchmark``; the program
sets its own cap with ``--fraction``, which advise says to raise): each round takes ``advise TRACE
--json``; where a setting fits at the limit it runs that; else it runs ``min_capacity_setting`` at
``fit_capacity_bytes`` (the program's fraction raised to it), under ``tracekit record --torch`` with
PyTorch's own ``max_memory_reserved`` and ``num_ooms`` beside it (``scripts/witness``). A run that
completes ends the loop (the advice held for the whole program); one that dies gives the next round
its trace. Writes ``OUT/<start>-r<k>.parquet``, ``.log``, ``-advise.json`` and ``OUT/loop.json``.

``--whole LIMIT`` (bytes, repeatable) instead: the workload recorded once with room to finish (its
fraction ``--room``, PyTorch's defaults: ``OUT/whole.parquet``), then the rounds from that trace with
``advise --limit LIMIT`` in the first: a trace of the whole program, advised at the cap it must fit.
With ``--capped``, each LIMIT is first run as the user's failing run (``OUT/capped-LIMIT.parquet``)
and advise's recommendation on it kept (it should name the whole run's recording).
``--workload`` another script of the same two options (``scripts/torch_workload_gpt2.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fit_capacity import device_and_out, run_workload  # one way to run the workload with its witness

ROOT = Path(__file__).resolve().parent.parent
START = [f"traces/fidelity/fit-capacity/{name}.parquet" for name in ("fraction-fit", "resnet35-fit")]
DEFAULTS = "PyTorch defaults"  # the label of the empty setting (``tracekit.advise.candidates``)


def conf_of(label: str) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` of the setting advise labels ``label`` (the label, but the defaults')."""
    return "" if label == DEFAULTS else label


def advise(trace: Path, out: Path, limit: int | None = None) -> dict:  # type: ignore[type-arg]
    ask = ["--limit", str(limit)] if limit is not None else []
    p = subprocess.run([sys.executable, "-m", "tracekit", "advise", str(trace), "--json", *ask], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    out.write_text(p.stdout or p.stderr)
    if p.returncode not in (0, 3):
        raise SystemExit(f"advise {trace} failed ({p.returncode}): {p.stderr[-500:]}")
    return json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--start", action="append", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=200)
    ap.add_argument("--whole", type=int, action="append", default=None, help="a cap (bytes) to advise at")
    ap.add_argument("--room", type=float, default=0.5, help="the fraction the whole run is recorded at")
    ap.add_argument("--capped", action="store_true", help="each --whole LIMIT first run as the failing run")
    ap.add_argument("--workload", default="scripts/torch_workload_resnet.py")
    a = ap.parse_args()
    name, total, out = device_and_out(a.out)
    loops: list[dict] = []  # type: ignore[type-arg]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc = {"device": name, "total_bytes": total, "date_utc": when, "steps": a.steps, "workload": a.workload,
           "loops": loops}
    for cap in (a.whole or []) if a.capped else []:  # the user's run that died, and what advise says of it
        label = f"capped-{cap}"
        got = run_workload(label, "", cap, total, a.steps, out, a.timeout, a.workload)
        said = advise(out / f"{label}.parquet", out / f"{label}-advise.json")["recommendation"]
        doc.setdefault("capped", []).append({"cap_bytes": cap, **got, "recommendation": said})
    starts: list[tuple[str, int | None]] = [(s, None) for s in a.start or START]
    if a.whole:
        room = int(a.room * total)
        doc["whole"] = run_workload("whole", "", room, total, a.steps, out, a.timeout, a.workload)
        starts = [(str(out / "whole.parquet"), cap) for cap in a.whole]
    for start, first_limit in starts:
        trace, rounds = ROOT / start, []
        stem = Path(start).stem + (f"-at{first_limit}" if first_limit else "")
        for k in range(1, a.rounds + 1):
            label = f"{stem}-r{k}"
            advice = advise(trace, out / f"{label}-advise.json", first_limit if k == 1 else None)
            if advice["fits"]:
                setting, cap, why = advice["fits"][0]["setting"], advice["limit_bytes"], "fits at the limit"
            elif advice.get("fit_capacity_bytes"):
                setting, cap = advice["min_capacity_setting"], advice["fit_capacity_bytes"]
                why = "fit capacity"
            else:
                rounds.append({"round": k, "advised": None, "recommendation": advice["recommendation"]})
                break
            got = run_workload(label, conf_of(setting), cap, total, a.steps, out, a.timeout, a.workload)
            where = trace.relative_to(ROOT) if trace.is_relative_to(ROOT) else trace
            rounds.append({"round": k, "from": str(where), "asked_limit": first_limit if k == 1 else None,
                           "setting": setting, "capacity_bytes": cap, "why": why,
                           "failing_seq": advice["failing_seq"], **got})
            print(json.dumps(rounds[-1]), flush=True)
            so_far = {**doc, "loops": [*loops, {"start": start, "rounds": rounds}]}  # kept if cut short
            (out / "loop.json").write_text(json.dumps(so_far, indent=1) + "\n")
            if got["exit_code"] == 0 or not (out / f"{label}.parquet").exists():
                break
            trace = out / f"{label}.parquet"
        loops.append({"start": start, "asked_limit": first_limit, "rounds": rounds})
    (out / "loop.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
