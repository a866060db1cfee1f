"""A ResNet-50 trained with AMP under a tight memory cap: cuDNN's handled OOMs, then a fatal one.

    python -m tracekit record --torch -o traces/torch-handled-oom.parquet scripts/torch_workload_resnet.py

torchvision's ResNet-50 (random weights, nothing downloaded) trains with
``torch.autocast`` (float16) and a GradScaler under
``torch.cuda.set_per_process_memory_fraction(FRACTION)`` with
``torch.backends.cudnn.benchmark = True``; each step has its own batch and
image size (from a fixed list, growing), so cuDNN benchmarks new shapes as
memory runs short and some of its workspace allocations fail: PyTorch
raises, cuDNN catches and tries a smaller workspace (handled OOMs). A later,
larger step cannot fit at all: the OOM ends the program.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torchvision

FRACTION = 0.03
SHAPES = [(8, 128), (16, 160), (24, 192), (16, 224), (32, 224), (48, 224), (64, 256), (96, 288), (128, 320)]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=FRACTION)
    ap.add_argument("--steps", type=int, default=len(SHAPES))
    args = ap.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_per_process_memory_fraction(args.fraction)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    for step, (batch, size) in enumerate(SHAPES[: args.steps]):
        x = torch.randn(batch, 3, size, size, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        print(f"step {step} batch {batch} size {size} loss {loss.item():.3f} "
              f"reserved {torch.cuda.memory_reserved() >> 20} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
