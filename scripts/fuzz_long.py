"""The long hostile-input run: the fuzz suite with many examples, then signals at random moments.

Usage: PYTHONPATH=. python scripts/fuzz_long.py [--budget SECONDS] [--signals N]

1. ``tests/*/test_fuzz_*.py`` with ``TRACEKIT_FUZZ=long`` (hundreds of examples per
   strategy, random seeds) under pytest.
2. A signal storm: a 1M-event synthetic trace replayed (cupy, torch, first-fit),
   analyzed and re-synthesized, each run sent SIGINT or SIGTERM at a random
   moment in its first few seconds. Every run must end with exit 0, 130 or 143
   (never a crash such as -11), at most one stderr line and no traceback, and
   leave no file behind but its complete output.

Exit status 0 when everything held; the failures are printed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal, even when started in the background


def fuzz(budget: float) -> bool:
    tests = sorted(map(str, ROOT.glob("tests/*/test_fuzz_*.py")))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env={**ENV, "TRACEKIT_FUZZ": "long"}, timeout=budget)
    except subprocess.TimeoutExpired:
        print(f"fuzz: stopped after the {budget:.0f} s budget (no failure so far)")
        return True
    return r.returncode == 0


def storm(n: int, work: Path) -> list[str]:
    trace = work / "t1m.parquet"
    subprocess.run([sys.executable, "-m", "tracekit.cli.app", "synth", "-p", "training", "-n", "1000000",
                    "-o", str(trace)], env=ENV, check=True, capture_output=True)
    verbs = [["replay", str(trace), "--sim", "cupy"], ["replay", str(trace), "--sim", "torch"],
             ["replay", str(trace), "--sim", "first-fit", "-o", "OUT"], ["analyze", str(trace)],
             ["synth", "-p", "random", "-n", "3000000", "-o", "OUT"]]
    failures = []
    for i in range(n):
        out = work / f"out{i}.parquet"
        args = [a.replace("OUT", str(out)) for a in random.choice(verbs)]
        sig = random.choice([signal.SIGINT, signal.SIGTERM])
        delay = random.uniform(0.2, 4.0)
        before = set(os.listdir(work))
        p = subprocess.Popen([sys.executable, "-m", "tracekit.cli.app", *args], env=ENV, cwd=work,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_default_signals)
        time.sleep(delay)
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            failures.append(f"{args} {sig.name} at {delay:.2f} s: no exit within 120 s")
            continue
        left = set(os.listdir(work)) - before - {out.name}
        ok_code = p.returncode in (0, 128 + sig)
        lines = [ln for ln in err.splitlines() if not ln.startswith(("tracekit: note", "tracekit: warning"))]
        partial = p.returncode != 0 and out.exists()
        if not ok_code or "Traceback" in err or len(lines) > 1 or left or partial:
            failures.append(f"{args} {sig.name} at {delay:.2f} s: exit {p.returncode}, left {sorted(left)}, "
                            f"partial output {partial}, stderr {err[-300:]!r}")
        out.unlink(missing_ok=True)
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for the fuzz suite")
    ap.add_argument("--signals", type=int, default=40, help="runs in the signal storm")
    a = ap.parse_args()
    ok = fuzz(a.budget)
    with tempfile.TemporaryDirectory() as d:
        failures = storm(a.signals, Path(d))
    for f in failures:
        print("signal:", f)
    print(f"fuzz suite {'held' if ok else 'FAILED'}; signal storm: {a.signals - len(failures)} of "
          f"{a.signals} runs held")
    return 0 if ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
