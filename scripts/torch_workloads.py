"""Real PyTorch workloads that dump CUDA caching-allocator memory snapshots.

Each workload trains a small transformer language model on random tokens with
a varying sequence length per step (the usual source of allocator
fragmentation), with PyTorch's allocation history turned on
(``_record_memory_history(enabled="all", context="all", stacks="python")``),
and pickles the snapshot. Every workload runs in its own process so allocator
settings (``PYTORCH_CUDA_ALLOC_CONF``) and the per-process memory fraction
start clean. The snapshot carries one extra top-level key, ``tracekit``, with
what PyTorch does not record itself (device, versions, memory fraction and the
byte limit it implies, the sequence-length schedule); ``tracekit import torch``
reads it when present.

Workloads:
  train       the training loop, unlimited;
  oom         the same loop under ``set_per_process_memory_fraction`` set to the
              peak reserved bytes of ``train``, then growing sequences until an
              out-of-memory error; the snapshot is dumped by the OOM observer;
  expandable  the training loop with ``expandable_segments:True`` and an
              ``empty_cache()`` halfway (segment_map / segment_unmap);
  tuned       the training loop with ``roundup_power2_divisions:4,max_split_size_mb:128``;
  wrap        a short run with ``max_entries`` so small that the ring buffer
              wraps (the history starts mid-run).

Usage: python scripts/torch_workloads.py all --out DIR
       python scripts/torch_workloads.py WORKLOAD --out DIR [--limit-bytes N]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCHEDULE = (128, 384, 256, 512, 192, 640, 320, 768, 96, 896, 448, 1024, 160, 576, 704, 256)
GROW = (1280, 1536, 2048, 2560, 3072, 4096, 5120, 6144)
WRAP_SCHEDULE = (256, 512, 128, 384)
BATCH = 16
VOCAB = 16000
MAX_ENTRIES = 400_000
WRAP_ENTRIES = 1500
TUNED_CONF = "roundup_power2_divisions:4,max_split_size_mb:128"


def build_model(torch: Any) -> Any:
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 512)
            layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.1, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = nn.Linear(512, VOCAB)

        def forward(self, x: Any) -> Any:
            n = x.shape[1]
            mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
            return self.head(self.enc(self.emb(x), mask=mask, is_causal=True))

    return LM().cuda()


def train(torch: Any, schedule: tuple[int, ...], on_step: Any = None) -> list[dict[str, int]]:
    """Train with one sequence length per step; the next batch is prefetched on a side stream."""
    torch.manual_seed(0)
    model = build_model(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    stats = []

    def fetch(n: int) -> Any:
        host = torch.randint(0, VOCAB, (BATCH, n + 1), pin_memory=True)
        with torch.cuda.stream(side):
            dev = host.to("cuda", non_blocking=True)
        main.wait_stream(side)
        dev.record_stream(main)  # freed while the main stream may still use it
        return dev

    batch = fetch(schedule[0])
    for i, n in enumerate(schedule):
        torch.cuda.reset_peak_memory_stats()
        tokens = batch
        if i + 1 < len(schedule):
            batch = fetch(schedule[i + 1])
        logits = model(tokens[:, :-1])
        loss = loss_fn(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del tokens, loss
        torch.cuda.synchronize()
        stats.append({
            "step": i, "seq": n,
            "peak_allocated": int(torch.cuda.max_memory_allocated()),
            "peak_reserved": int(torch.cuda.max_memory_reserved()),
        })
        print(f"step {i} seq {n} peak_alloc {stats[-1]['peak_allocated']} "
              f"peak_reserved {stats[-1]['peak_reserved']}", flush=True)
        if on_step:
            on_step(i)
    return stats


def env_info(torch: Any) -> dict[str, Any]:
    free, total = torch.cuda.mem_get_info(0)
    props = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:  # the versions are informative only
        smi = f"nvidia-smi failed: {e}"
    return {
        "torch_version": str(torch.__version__), "cuda_version": str(torch.version.cuda),
        "device_name": props.name, "capability": f"{props.major}.{props.minor}",
        "total_bytes": int(total), "free_bytes_at_start": int(free),
        "props_total_memory": int(props.total_memory), "nvidia_smi": smi,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }


def dump(torch: Any, path: Path, meta: dict[str, Any]) -> None:
    snap = torch.cuda.memory._snapshot()
    snap["tracekit"] = meta
    tmp = path.with_suffix(".tmp-pickle")
    with open(tmp, "wb") as f:
        pickle.dump(snap, f)
    tmp.replace(path)
    print(f"dumped {path} ({path.stat().st_size} bytes)", flush=True)


def run_one(name: str, out: Path, limit: int | None) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"workload": name, **env_info(torch)}
    entries = WRAP_ENTRIES if name == "wrap" else MAX_ENTRIES
    meta["max_entries"] = entries
    path = out / f"torch-{name}.pickle"
    if name == "oom":
        assert limit is not None, "the oom workload needs --limit-bytes"
        frac = limit / meta["total_bytes"]
        torch.cuda.set_per_process_memory_fraction(frac, 0)
        meta.update(memory_fraction=frac, allowed_bytes=int(frac * meta["total_bytes"]))

        def observer(device: int, alloc: int, allowed: int, device_free: int) -> None:
            meta["oom_observer"] = {"device": device, "alloc_size": alloc,
                                    "total_or_allowed": allowed, "device_free": device_free}
            meta["allowed_bytes"] = int(allowed)
            dump(torch, path, meta)

        torch._C._cuda_attach_out_of_memory_observer(observer)
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=entries)
    t0 = time.time()
    if name == "wrap":
        meta["schedule"] = list(WRAP_SCHEDULE)
        stats = train(torch, WRAP_SCHEDULE)
    elif name == "expandable":
        meta["schedule"] = list(SCHEDULE)
        half = len(SCHEDULE) // 2
        stats = train(torch, SCHEDULE, on_step=lambda i: torch.cuda.empty_cache() if i == half else None)
        meta["empty_cache_after_step"] = half
    elif name == "oom":
        meta["schedule"] = list(SCHEDULE + GROW)
        try:
            stats = train(torch, SCHEDULE + GROW)
            meta["oom_error"] = None
        except torch.cuda.OutOfMemoryError as e:
            meta["oom_error"] = str(e)
            stats = []
        print(f"oom: {meta['oom_error']}", flush=True)
    else:
        meta["schedule"] = list(SCHEDULE)
        stats = train(torch, SCHEDULE)
    meta["seconds"] = round(time.time() - t0, 3)
    meta["steps"] = stats
    if not (name == "oom" and meta.get("oom_observer")):
        dump(torch, path, meta)
    (out / f"torch-{name}.meta.json").write_text(json.dumps(meta, indent=1))
    torch.cuda.memory._record_memory_history(enabled=None)


def run_all(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rc = 0
    script = str(Path(__file__).resolve())

    def sub(name: str, extra: list[str], env: dict[str, str] | None = None) -> int:
        cmd = [sys.executable, script, name, "--out", str(out), *extra]
        print("+", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, env={**os.environ, **(env or {})}, timeout=200)
        print(f"{name}: exit {r.returncode}", flush=True)
        return r.returncode

    rc |= sub("train", [])
    try:
        steps = json.loads((out / "torch-train.meta.json").read_text())["steps"]
        peak = max(s["peak_reserved"] for s in steps)
    except Exception as e:
        print(f"no train peak ({e}); using 4 GiB", flush=True)
        peak = 4 << 30
    limit = -(-peak // (2 << 20)) * (2 << 20)
    rc |= sub("oom", ["--limit-bytes", str(limit)])
    rc |= sub("expandable", [], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    rc |= sub("tuned", [], {"PYTORCH_CUDA_ALLOC_CONF": TUNED_CONF})
    rc |= sub("wrap", [])
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["all", "train", "oom", "expandable", "tuned", "wrap"])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit-bytes", type=int, default=None)
    a = p.parse_args()
    if a.workload == "all":
        return run_all(a.out)
    run_one(a.workload, a.out, a.limit_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
