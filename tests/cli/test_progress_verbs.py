"""Long verbs say so: a bar on a terminal's stderr, nothing on a pipe, and --json stdout stays clean.

The library reports between chunks of its compiled work (``tracekit.progress.report``/``part``);
each verb installs the receiver only when stderr is a terminal. The subprocess tests give the
verb a pseudo-terminal as stderr and a pipe as stdout, as a shell piping ``--json`` output would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tracekit import progress
from tracekit.synth import Pattern, synthesize

REPO = Path(__file__).resolve().parents[2]
EVENTS = 3_000_000  # about a second or more of work per verb here: past the point where a bar draws


def _run(args: list[str], *, tty: bool) -> tuple[int, str, str]:
    """Run ``python -m tracekit ARGS`` with stdout on a pipe and stderr on a pty (``tty``) or a pipe."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tracekit", *args]
    if not tty:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        return p.returncode, p.stdout, p.stderr
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # a full pty buffer would block the child
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=REPO)
        os.close(slave)
        out, _ = p.communicate(timeout=300)
        reader.join(timeout=10)
    finally:
        os.close(master)
    return p.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """``tracekit synth`` of a large trace with stderr on a terminal: (the trace, exit code, stderr)."""
    out = tmp_path_factory.mktemp("big") / "random.parquet"
    rc, _, err = _run(["synth", "--pattern", "random", "--events", str(EVENTS), "-o", str(out)], tty=True)
    return out, rc, err


@pytest.fixture(scope="module")
def big(synth_run: tuple[Path, int, str]) -> Path:
    assert synth_run[1] == 0, synth_run[2]
    return synth_run[0]


def test_part_maps_each_phase_into_its_share_and_only_moves_forward() -> None:
    seen: list[tuple[int, int]] = []
    with progress.reporting(lambda d, t: seen.append((d, t))):
        for k in range(2):
            with progress.part(k, 2):
                progress.report(1, 4)
                progress.report(4, 4)
    fracs = [d / t for d, t in seen]
    assert fracs == [0.125, 0.5, 0.5, 0.625, 1.0, 1.0]
    with progress.part(0, 2):  # no receiver: nothing to map, nothing fails
        progress.report(1, 1)


def test_synthesize_reports_events_written(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    with progress.reporting(lambda d, t: seen.append((d, t))):
        synthesize(Pattern.RANDOM, 50_000, 0, tmp_path / "t.parquet")
    assert seen and seen[-1] == (50_000, 50_000)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_synth_shows_a_bar_on_a_terminal(synth_run: tuple[Path, int, str]) -> None:
    _, rc, err = synth_run
    assert rc == 0, err
    assert "\rsynth" in err and "100.0%" in err


def test_analyze_json_on_a_terminal_bar_on_stderr_clean_stdout(big: Path) -> None:
    rc, out, err = _run(["analyze", str(big), "--json"], tty=True)
    assert rc == 0, err
    assert "\ranalyzing" in err and "100.0%" in err
    assert json.loads(out)["events"] == EVENTS  # stdout is the JSON document and nothing else


def test_no_bar_when_stderr_is_not_a_terminal(big: Path) -> None:
    rc, out, err = _run(["analyze", str(big), "--json"], tty=False)
    assert rc == 0, err
    assert "analyzing" not in err and "%" not in err
    json.loads(out)
