"""``tracekit replay TRACE --sim POLICY | --device N``: replay a trace through an allocator.

With ``--sim`` the trace runs through a simulated allocator (see
``tracekit.sim``); with ``--device`` it runs on a real GPU (see
``tracekit.device``). Either way the result is a summary (text or ``--json``)
and, with ``-o``, the replay as a trace (format version 3).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.core import TyperCommand

from tracekit.cli.quick_exit import skip_teardown
from tracekit.sim.allocators import Allocator  # light: no NumPy; the names --allocator takes


class ReplayCommand(TyperCommand):
    """``replay`` whose ``--sim`` help names the registered policies, read only when help is shown."""

    def format_help(self, ctx: typer.Context, formatter: object) -> None:  # type: ignore[override]
        from tracekit.sim import policies

        for param in self.params:
            if param.name == "sim" and hasattr(param, "help"):
                param.help = f"Simulated allocator: {policies.help_text()}. An unknown name lists all."
        super().format_help(ctx, formatter)  # type: ignore[arg-type]


PROGRESS_MIN_EVENTS = 1_000_000


def replay(
    trace: Path = typer.Argument(..., help="A trace (.parquet), format version 1, 2 or 3."),
    sim: str | None = typer.Option(
        None, "--sim", metavar="POLICY",
        help="Simulated allocator (the policies are listed by `replay --help`).",
    ),
    device: int | None = typer.Option(None, "--device", help="Replay on this GPU instead of simulating."),
    allocator: Allocator = typer.Option(
        Allocator.CUPY, "--allocator",
        help="With --device: the allocator that serves the requests (torch: PyTorch's caching allocator).",
    ),
    compare_sim: str | None = typer.Option(
        None, "--compare-sim", metavar="POLICY", help="With --device: also simulate POLICY and compare."
    ),
    capacity: str | None = typer.Option(
        None, "--capacity", metavar="SIZE",
        help="Heap size (heap policies) or pool limit (pool policies), e.g. 6GiB, or 'none'. Default: "
        "unbounded for heaps; for pools the pool limit the trace was recorded under.",
    ),
    device_total: str | None = typer.Option(
        None, "--device-total", metavar="SIZE", help="Device memory under a pool; default unbounded."
    ),
    torch_conf: str | None = typer.Option(
        None, "--torch-conf", metavar="CONF",
        help='PyTorch allocator settings, e.g. "expandable_segments:True,max_split_size_mb:256".',
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Write the replay as a trace (format version 3)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    continue_on_oom: bool = typer.Option(
        False, "--continue-on-oom", help="Skip a failed request (and its free) and go on."
    ),
    stop_at_first_oom: bool = typer.Option(
        False, "--stop-at-first-oom",
        help="Stop at the first request that fails, also one the program survived (a handled OOM); "
        "by default a replay goes on past those, as the program did, to the OOM it died of.",
    ),
    pool: int | None = typer.Option(
        None, "--pool", metavar="ID",
        help="With --sim: that pool's events alone (the trace's pool column, as info lists them), "
        "under its own recorded limit unless --capacity is given: each CuPy pool has its own.",
    ),
    as_recorded: bool = typer.Option(
        False, "--as-recorded",
        help="With --sim: replay the recording exactly as recorded (every release point, address and "
        "tie it recorded), not the prediction advise and whatif make for the setting.",
    ),
    fail_on_oom: bool = typer.Option(False, "--fail-on-oom", help="Exit with code 3 if any request failed."),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
) -> None:
    """Replay a trace through a simulated allocator (--sim) or on a GPU (--device)."""
    if device is None:  # simulated: tracekit's own code only (quick_exit)
        skip_teardown()
    from tracekit.errors import UsageError

    if (sim is None) == (device is None):
        raise UsageError("give exactly one of --sim POLICY or --device N")
    if continue_on_oom and stop_at_first_oom:
        raise UsageError("--continue-on-oom and --stop-at-first-oom are exclusive: give one")
    if device is not None:
        if device_total is not None:
            raise UsageError("--device-total applies to --sim, not --device")
        if as_recorded:
            raise UsageError("--as-recorded applies to --sim; a device replay follows the recording as it is")
        if pool is not None:
            raise UsageError("--pool applies to --sim; a device replay serves every pool's requests")
        _device(trace, device, allocator.value, capacity, output, json_out, fail_on_oom,
                continue_on_oom, compare_sim, force, torch_conf, stop_at_first_oom)
        return
    if compare_sim is not None:
        raise UsageError("--compare-sim applies to --device; with --sim, run replay once per policy")
    assert sim is not None
    _simulate(trace, sim, capacity, device_total, torch_conf, output, json_out, continue_on_oom,
              fail_on_oom, force, stop_at_first_oom, as_recorded, pool)


def _device(trace: Path, device: int, allocator: str, capacity: str | None, output: Path | None,
            json_out: bool, fail_on_oom: bool, continue_on_oom: bool, compare_sim: str | None,
            force: bool, torch_conf: str | None, stop_at_first_oom: bool) -> None:
    from tracekit.cli.common import echo_json, say, wrote
    from tracekit.errors import DeviceError, OOMVerdict

    try:
        from tracekit.device.command import run_device_replay
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("tracekit"):
            raise
        raise DeviceError("replay on a GPU is not available in this installation") from None
    out = run_device_replay(
        trace, device=device, allocator=allocator, capacity=capacity, output=output,
        continue_on_oom=continue_on_oom, compare_sim=compare_sim, force=force, torch_conf=torch_conf,
        stop_at_first_oom=stop_at_first_oom,
    )
    if out.written is not None:
        wrote(out.written)
    if json_out:
        echo_json(out.to_dict())
    else:
        say(out.to_text())
    if fail_on_oom and out.verdict is not None:
        raise OOMVerdict(out.verdict)


def _simulate(trace: Path, sim: str, capacity: str | None, device_total: str | None,
              torch_conf: str | None, output: Path | None, json_out: bool, continue_on_oom: bool,
              fail_on_oom: bool, force: bool, stop_at_first_oom: bool, as_recorded: bool,
              pool: int | None) -> None:
    from tracekit.advise.replay import replay_file
    from tracekit.cli.common import echo_json, say, wrote
    from tracekit.errors import OOMVerdict
    from tracekit.progress import Progress
    from tracekit.sim.base import SimConfig
    from tracekit.sim.options import parse_alloc_conf
    from tracekit.trace.devices import require_single_device_file
    from tracekit.units import format_size, parse_size

    if pool is not None:  # the pool's device (checked first: a wrong id costs no note, nor a read)
        from tracekit.trace.devices import pool_device_file

        device: int | None = pool_device_file(trace, pool)
    else:
        device = require_single_device_file(trace, "a simulated replay")
    config = SimConfig(
        capacity=_capacity(trace, sim, capacity, device, pool),
        device_total=parse_size(device_total, "--device-total") if device_total is not None else None,
        continue_on_oom=continue_on_oom,
        options=parse_alloc_conf(torch_conf) if torch_conf is not None else {},
        stop_at_first_oom=stop_at_first_oom,
        per_event=output is not None,  # printed: the summary alone
    )
    bar = Progress("replaying", enabled=sys.stderr.isatty(), min_total=PROGRESS_MIN_EVENTS)
    try:
        result = replay_file(trace, sim, config, output=output, command=" ".join(["tracekit", *sys.argv[1:]]),
                             on_progress=bar, force=force, as_recorded=as_recorded, pool=pool)
    finally:
        bar.close()
    for warning in result.warnings:
        say(f"tracekit: warning: {trace}: {warning}", err=True)
    if output is not None:
        wrote(output)
    if json_out:
        echo_json(result.to_dict())
    else:
        say(result.to_text())
    oom = result.summary.oom
    if fail_on_oom and oom is not None:
        raise OOMVerdict(
            f"{trace}: out of memory under {sim} at seq {oom.seq} "
            f"(request {format_size(oom.size)}, largest free block {format_size(oom.largest_free_block)}; "
            f"{result.summary.oom_count} failed request(s))"
        )


def _capacity(trace: Path, sim: str, capacity: str | None, device: int | None,
              pool: int | None) -> int | None:
    """``--capacity`` in bytes; for a pool policy, absent means the recorded pool limit of the trace's
    ``device`` (its default pool's as the program left it, else at the start:
    ``trace.outcome.pool_limit_of``), or of ``pool`` where one is named (``trace.outcome.pool_limit``)."""
    from tracekit.errors import UsageError
    from tracekit.sim import policies
    from tracekit.trace.reader import read_meta
    from tracekit.units import format_size, parse_size

    if capacity is not None:
        if capacity.strip().lower() in ("none", "unbounded"):
            return None
        if (value := parse_size(capacity, "--capacity")) == 0:  # 0 would read as "no limit" below
            raise UsageError("--capacity must be positive; --capacity none lifts the limit")
        return value
    if not policies.get(sim).traits.recorded_limit:
        return None
    from tracekit.cli.common import say
    from tracekit.trace.outcome import is_own_pool, pool_limit, pool_limit_of

    meta = read_meta(trace)
    if pool is not None:
        limit = pool_limit(meta, pool, device if device is not None else 0)
        if limit:
            say(f"tracekit: note: {trace}: replaying pool {pool} alone under its recorded limit of "
                f"{format_size(limit)} ({limit} bytes); --capacity none lifts it", err=True)
        return limit
    limit = pool_limit_of(meta, device)  # one the program set itself too
    if limit:
        say(f"tracekit: note: {trace}: replaying under the recorded pool limit of "
            f"{format_size(limit)} ({limit} bytes); --capacity none lifts it", err=True)
    recorded = meta.recorded
    own = sorted({o.pool_id for o in recorded.ooms if o.pool_id is not None
                  and is_own_pool(recorded, o.pool_id, o.device if o.device is not None else device or 0)})
    if own:  # the simulator holds every pool of the device to one limit; CuPy keeps one a pool
        say(f"tracekit: note: {trace}: the recorded out-of-memory errors were in pool(s) the program made "
            f"itself ({', '.join(map(str, own))}), each with a limit of its own; this replay holds every "
            f"pool to one limit (--capacity); --pool {own[0]} replays that pool alone under its own, and "
            "tracekit advise answers for it", err=True)
    return limit


def register(app: typer.Typer) -> None:
    app.command("replay", cls=ReplayCommand)(replay)
