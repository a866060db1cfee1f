"""On a GPU: record two PyTorch programs, let ``advise`` rate settings, then run every rated setting for real.

    python3 scripts/torch_fidelity_check.py OUT [--deadline SECONDS] [--parallel N]

1. ``tracekit record --torch`` of torchvision's ResNet-50 under a 3 % memory fraction
   (``scripts/torch_workload_resnet.py``: cuDNN's handled OOMs, then a fatal one) and of a
   GPT-2-shaped ``transformers`` model on variable sequence lengths
   (``scripts/torch_workload_gpt2.py``) under a fraction set just above the peak it
   allocates uncapped (a first, uncapped run measures it), so the caching allocator's
   fragmentation decides whether it fits.
2. ``tracekit advise --json`` of each recording (it rates every candidate setting at the
   recorded limit).
3. Every rated setting run for real: the same program, fraction and arguments with
   ``PYTORCH_CUDA_ALLOC_CONF`` set to the candidate, several at a time (each process has
   its own fraction of the device), recording the exit code (0: it fits) and
   ``torch.cuda.max_memory_reserved()`` at exit.

Writes ``OUT/results.json`` (after every finished run, so a deadline leaves what was
done), the two traces and their snapshots, and ``OUT/logs.tar.gz``. ``--run-one
SCRIPT ARGS`` is the wrapper each real run goes through: it runs SCRIPT as ``__main__``
and prints one ``TRACEKIT_PEAK {json}`` line at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESNET = "scripts/torch_workload_resnet.py"
GPT2 = "scripts/torch_workload_gpt2.py"
RESNET_TRACE = "torch-resnet-fraction.parquet"
GPT2_TRACE = "torch-gpt2-lengths.parquet"
MARK = "TRACEKIT_PEAK "
STDERR = "--- stderr\n"


def run_one(argv: list[str]) -> None:
    """Run ``argv[0]`` as ``__main__`` with ``argv[1:]``; print the CUDA peaks at exit."""
    import torch

    def peaks() -> None:
        if torch.cuda.is_initialized():
            print(MARK + json.dumps({
                "max_reserved": torch.cuda.max_memory_reserved(),
                "max_allocated": torch.cuda.max_memory_allocated(),
                "total": torch.cuda.get_device_properties(0).total_memory,
            }), flush=True)

    atexit.register(peaks)
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


def _env(conf: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return env


def _sh(args: list[str], log: Path, conf: str | None = None, timeout: float = 200) -> tuple[int, str, float]:
    """Run ``args`` in the repository; (exit code, stdout then stderr, seconds); a log file each."""
    t = time.time()
    try:
        p = subprocess.run(args, cwd=ROOT, env=_env(conf), capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, str(e.stdout or ""), f"timed out after {timeout} s\n{e.stderr or ''}"
    head = f"$ {' '.join(args)}  (PYTORCH_CUDA_ALLOC_CONF={conf or ''})\nrc {rc}\n"
    log.write_text(f"{head}{out}\n{STDERR}{err}")
    return rc, out + "\n" + STDERR + err, time.time() - t


def _peak(out: str) -> dict[str, int] | None:
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    return json.loads(lines[-1][len(MARK):]) if lines else None


def conf_text(options: dict[str, str]) -> str:
    order = ["expandable_segments", "max_split_size_mb", "roundup_power2_divisions",
             "garbage_collection_threshold"]
    keys = sorted(options, key=lambda k: (order.index(k) if k in order else len(order), k))
    return ",".join(f"{k}:{options[k]}" for k in keys)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--run-one"]:
        run_one(argv[1:])
        return 0
    out = Path(argv[0]).resolve()
    deadline = time.time() + (float(argv[argv.index("--deadline") + 1]) if "--deadline" in argv else 330)
    parallel = int(argv[argv.index("--parallel") + 1]) if "--parallel" in argv else 8
    logs = Path("/tmp/tracekit-fidelity-logs")  # not under OUT: only 8 files come back
    logs.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    me = str(Path(__file__).resolve())
    results: dict[str, object] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=1))

    # Compile the simulator's kernels while the programs record (numba caches them).
    warm = subprocess.Popen([py, "-m", "tracekit", "advise", "--json", "traces/torch-handled-oom.parquet"],
                            cwd=ROOT, env=_env(None), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with ThreadPoolExecutor(2) as ex:
        cal = ex.submit(_sh, [py, me, "--run-one", GPT2, "--fraction", "0"], logs / "gpt2-uncapped.log")
        record = [py, "-m", "tracekit", "record", "--torch", "-o"]
        rec_r = ex.submit(_sh, [*record, str(out / RESNET_TRACE), RESNET], logs / "record-resnet.log")
        rc, text, secs = cal.result()
        uncapped = _peak(text)
        results["gpt2_uncapped"] = {"rc": rc, "peak": uncapped, "seconds": secs}
        save()
        assert uncapped is not None, text[-2000:]
        fraction = round(uncapped["max_allocated"] * 1.03 / uncapped["total"], 5)
        programs = {
            "resnet": {"script": RESNET, "args": ["--fraction", "0.03"], "trace": RESNET_TRACE},
            "gpt2": {"script": GPT2, "args": ["--fraction", str(fraction)], "trace": GPT2_TRACE},
        }
        results["programs"] = programs
        rec_g = ex.submit(_sh, [*record, str(out / GPT2_TRACE), GPT2, "--fraction", str(fraction)],
                          logs / "record-gpt2.log")
        for name, fut in (("resnet", rec_r), ("gpt2", rec_g)):
            rc, text, secs = fut.result()
            results[f"record_{name}"] = {"rc": rc, "seconds": secs, "tail": text[-600:]}
        save()
    try:
        warm.wait(timeout=max(1.0, deadline - time.time() - 240))
    except subprocess.TimeoutExpired:
        warm.kill()  # the advise runs below compile what is left
        warm.wait()
    with ThreadPoolExecutor(2) as ex:
        futs = {name: ex.submit(_sh, [py, "-m", "tracekit", "advise", "--json", "--jobs", "6",
                                      str(out / p["trace"])], logs / f"advise-{name}.log")
                for name, p in programs.items()}
        advice = {}
        for name, fut in futs.items():
            rc, text, secs = fut.result()
            body = text.split("\n" + STDERR)[0]
            advice[name] = json.loads(body) if rc == 0 else {"error": text[-1500:]}
            results[f"advise_{name}"] = {"rc": rc, "seconds": secs, "result": advice[name]}
    save()
    jobs = []
    for name, adv in advice.items():
        for cand in adv.get("tried", []):
            if cand.get("kind") == "torch-conf":
                jobs.append((name, conf_text(cand.get("options") or {}), cand))
    # Defaults first, then the programs alternately, so a deadline leaves both partly covered.
    rank = {n: [j for j in jobs if j[0] == n] for n in advice}
    jobs.sort(key=lambda j: (j[1] != "", rank[j[0]].index(j)))
    runs: list[dict[str, object]] = []
    results["runs"] = runs

    def real(job: tuple[str, str, dict[str, object]]) -> None:
        name, conf, cand = job
        left = deadline - time.time()
        if left < 20:
            runs.append({"program": name, "setting": conf, "skipped": "deadline"})
            return
        p = programs[name]
        log = logs / f"real-{name}-{(conf or 'defaults').replace(':', '-').replace(',', '_')}.log"
        rc, text, secs = _sh([py, me, "--run-one", p["script"], *p["args"]], log, conf, timeout=left - 5)
        peak = _peak(text)
        runs.append({
            "program": name, "setting": conf or "PyTorch defaults", "predicted_fits": cand.get("fits"),
            "predicted_peak_reserved": cand.get("peak_reserved_bytes"),
            "capacity": cand.get("capacity_bytes"),
            "rc": rc, "real_fits": rc == 0, "oom": "OutOfMemoryError" in text,
            "real_peak_reserved": peak["max_reserved"] if peak else None,
            "real_peak_allocated": peak["max_allocated"] if peak else None, "seconds": round(secs, 1),
        })
        save()

    with ThreadPoolExecutor(parallel) as ex:
        list(ex.map(real, jobs))
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
