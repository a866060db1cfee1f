"""Print docs/fidelity.md's table of advice against the real program, from ``traces/fidelity/*.json``.

    python3 scripts/fidelity_table.py

One row per setting run for real by ``advise --rerun`` (``scripts/gpu_real_advice.py`` on the
H200): advise's verdict and predicted peak reserved, what the real run did, its peak reserved from
its own trace and from PyTorch's own ``max_memory_reserved()`` (the witness written beside it).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = {"resnet30": "ResNet-50, 3 % (4.19 GiB)", "handled": "ResNet-50, 3 % (torch-handled-oom)",
         "resnet35": "ResNet-50, 3.5 % (4.89 GiB)", "resnet35r": "ResNet-50, 3.5 % (again)",
         "dcgan": "pytorch/examples dcgan", "wlm": "pytorch/examples word_language_model"}


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.3f}"


def main() -> None:
    print("| program | cap | setting | advise | replay's headroom / margin (MiB) | real run | agrees | "
          "peak reserved predicted / real / PyTorch (GiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for f in sorted((ROOT / "traces" / "fidelity").glob("*.json")):
        d = json.loads(f.read_text())
        if "advise" not in d:  # another fidelity record (rmm.json), not an advise rerun
            continue
        a = d["advise"]
        tried = {r["setting"]: r for r in a["tried"]}
        witness = {w["conf"]: w for w in d["rerun_witness"]}
        for r in a["reruns"]:
            if not r["ran"]:
                continue
            t = tried[r["setting"]]
            conf = "" if r["setting"] == "PyTorch defaults" else r["setting"]
            w = witness.get(conf, {})
            past = r["got_past_failing_request"]
            real = ("finished" if r["finished"] else
                    f"OOM {'after' if past else 'at'} the failing request" if past is not None else "OOM")
            agrees = {True: "yes", False: "**no**", None: "no claim"}[r["agrees"]]
            head = ("" if t["headroom_bytes"] is None or not t["gets_through"]
                    else f"{t['headroom_bytes'] / 2**20:.1f} / {t['margin_bytes'] / 2**20:.1f}")
            print(f"| {NAMES.get(d['case'], d['case'])} | {gib(a['limit_bytes'])} GiB | `{r['setting']}` | "
                  f"{r['predicted']} | {head} | {real} | {agrees} | "
                  f"{gib(r['predicted_peak_reserved_bytes'])} / {gib(r['real_peak_reserved_bytes'])} / "
                  f"{gib(w.get('max_reserved'))} |")


if __name__ == "__main__":
    main()
