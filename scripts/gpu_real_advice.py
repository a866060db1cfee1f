"""On a GPU: does the advice hold on the real program? Record, advise, and ``advise --rerun``.

    python3 scripts/gpu_real_advice.py OUT CASE... [--examples DIR] [--rerun N]

Cases:
- ``dcgan``: pytorch/examples' ``dcgan/main.py --dataset fake --accel --niter 1`` (cuDNN
  convolutions, ``cudnn.benchmark``), from ``--examples`` (a checkout of pytorch/examples);
- ``wlm``: pytorch/examples' ``word_language_model/main.py --accel --epochs 1`` (an LSTM on
  wikitext-2, which the repository carries);
- ``resnet35``: ``scripts/torch_workload_resnet.py --fraction 0.035`` (torchvision's ResNet-50, AMP,
  ``cudnn.benchmark``, growing shapes: handled cuDNN OOMs, then a fatal one) at a second cap;
- ``resnet30``, ``handled``, ``resnet35r``: the committed ``traces/torch-resnet-fraction.parquet``,
  ``traces/torch-handled-oom.parquet`` (the same program at 3 %) and ``traces/torch-resnet35.parquet``,
  re-run only.

A program nobody here wrote has no cap of its own: it runs once uncapped, and is recorded with
``tracekit record --torch --limit CAP``, CAP = its peak allocated + a quarter of the way to its
peak reserved (PyTorch's own counters of the uncapped run). Then ``tracekit advise TRACE --json
--rerun N`` rates every setting and runs the program for real under the N best. Beside every
process, ``scripts/witness/sitecustomize.py`` writes PyTorch's own ``max_memory_reserved`` and
``num_ooms`` at exit (the independent witness). Writes ``OUT/CASE.parquet``, ``OUT/CASE.json``
(advise with its reruns, the witness lines, the cap) and ``OUT/logs.tar.gz``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WITNESS_DIR = ROOT / "scripts" / "witness"
COMMITTED = {"resnet30": "torch-resnet-fraction", "handled": "torch-handled-oom",
             "resnet35r": "torch-resnet35"}


def env(witness: Path) -> dict[str, str]:
    e = dict(os.environ)
    paths = [str(ROOT), str(WITNESS_DIR), e.get("PYTHONPATH", "")]
    e["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    e["TRACEKIT_WITNESS"] = str(witness)
    e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return e


def run(cmd: list[str], cwd: Path, witness: Path, log: Path, timeout: float) -> tuple[int, float]:
    t0 = time.time()
    with log.open("ab") as fh:
        fh.write(f"$ {' '.join(cmd)}  (in {cwd})\n".encode())
        fh.flush()
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env(witness), stdout=fh, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, round(time.time() - t0, 1)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--examples", type=Path, default=ROOT / ".gpu_work" / "examples")
    ap.add_argument("--rerun", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--keep-reruns", action="store_true", help="OUT/CASE-reruns.tar.gz: the reruns' traces")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    py = sys.executable
    programs = {
        "dcgan": (a.examples / "dcgan", ["main.py", "--dataset", "fake", "--accel", "--niter", "1",
                                         "--workers", "0", "--outf", str(out / "logs" / "dcgan-out")]),
        "wlm": (a.examples / "word_language_model", ["main.py", "--accel", "--epochs", "1",
                                                     "--save", str(out / "logs" / "wlm.pt")]),
        "resnet35": (ROOT, ["scripts/torch_workload_resnet.py", "--fraction", "0.035"]),
    }
    for case in a.cases:
        t0 = time.time()
        witness = logs / f"{case}-witness.jsonl"
        log = logs / f"{case}.log"
        result: dict = {"case": case, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if case in COMMITTED:  # committed recordings: re-run only
            trace = ROOT / "traces" / f"{COMMITTED[case]}.parquet"
            cwd = ROOT
        else:
            cwd, argv = programs[case]
            (logs / "dcgan-out").mkdir(exist_ok=True)
            limit_args: list[str] = []
            if case != "resnet35":  # no cap of its own: measure it uncapped first
                rc, secs = run([py, *argv], cwd, witness, log, a.timeout)
                w = lines(witness)[-1]
                cap = int(w["max_allocated"] + 0.25 * (w["max_reserved"] - w["max_allocated"]))
                result["uncapped"] = {"rc": rc, "seconds": secs, **w}
                result["cap_bytes"] = cap
                limit_args = ["--limit", str(cap)]
            trace = out / f"{case}.parquet"
            rc, secs = run([py, "-m", "tracekit", "record", "--torch", *limit_args, "-o", str(trace), *argv],
                           cwd, witness, log, a.timeout)
            result["record"] = {"rc": rc, "seconds": secs, "witness": lines(witness)[-1:]}
            snapshot = trace.with_suffix(".pickle")
            if snapshot.exists():  # the trace holds every event; the raw snapshot stays behind
                snapshot.rename(logs / snapshot.name)
        n0 = len(lines(witness))
        adv = subprocess.run([py, "-m", "tracekit", "advise", str(trace), "--json", "--rerun", str(a.rerun),
                              "--rerun-timeout", str(a.timeout), "--rerun-dir", str(logs / f"{case}-reruns")],
                             cwd=cwd, env=env(witness), capture_output=True, text=True)
        result["advise_rc"] = adv.returncode
        result["advise_stderr"] = adv.stderr[-4000:]
        result["advise"] = json.loads(adv.stdout) if adv.returncode == 0 else None
        result["rerun_witness"] = lines(witness)[n0:]
        result["seconds"] = round(time.time() - t0, 1)
        (out / f"{case}.json").write_text(json.dumps(result, indent=1))
        print(case, "done in", result["seconds"], "s; advise rc", adv.returncode, flush=True)
        if a.keep_reruns:
            with tarfile.open(out / f"{case}-reruns.tar.gz", "w:gz") as tf:
                for f in sorted((logs / f"{case}-reruns").glob("*.parquet")):
                    tf.add(f, arcname=f.name)
        for f in (logs / f"{case}-reruns").glob("*.parquet"):
            f.unlink()  # the reruns' traces stay on the device: their figures are in CASE.json
        for f in (logs / f"{case}-reruns").glob("*.pickle"):
            f.unlink()
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
        tf.add(logs, arcname="logs",
               filter=lambda ti: None if ti.name.endswith((".pt", ".png", ".pickle")) else ti)
    import shutil

    shutil.rmtree(logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
