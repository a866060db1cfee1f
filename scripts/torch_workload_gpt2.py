"""A GPT-2-shaped ``transformers`` model trained on variable sequence lengths under a memory fraction.

    python -m tracekit record --torch -o gpt2.parquet scripts/torch_workload_gpt2.py --fraction 0.02

The model is built from a ``GPT2Config`` (random weights, nothing downloaded: 8 layers,
768 wide, 12 heads, a 16,384-token vocabulary) and trained with AdamW for ``--steps``
steps; each step draws its batch's sequence length from a seeded list between 96 and
1,024 tokens, so activations of many sizes come and go and the caching allocator's
blocks split and fragment. ``--fraction`` caps the process with
``torch.cuda.set_per_process_memory_fraction``; 0 leaves it uncapped. Each step prints
its length and the reserved bytes; an out-of-memory error ends the program (exit 1).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

LENGTHS = (96, 160, 256, 384, 512, 640, 768, 896, 1024)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.fraction > 0:
        torch.cuda.set_per_process_memory_fraction(args.fraction)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = GPT2Config(n_layer=8, n_embd=768, n_head=12, vocab_size=16384, n_positions=1024)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        length = rng.choice(LENGTHS)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, length), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print(f"step {step} length {length} loss {loss.item():.3f} "
              f"reserved {torch.cuda.memory_reserved() >> 20} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
