"""The text parts of the report: header and verdict, summary tables, baseline and what-if sections.

Everything here is text built from the analyzer's ``summary.to_dict()`` (and
the what-if result's ``to_dict()``): the numbers a reader can copy, search
and quote, next to the pictures. Values are shown in human units with the
exact byte count beside them (``tracekit.report.html.fmt_value``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from tracekit.analysis.summary import handled_line
from tracekit.errors import InputError
from tracekit.inputs import load_json_file
from tracekit.report.html import esc, fmt_value, table
from tracekit.trace import Trace
from tracekit.units import format_size

SUMMARY_KEYS = (
    "events",
    "duration_s",
    "peak_live_bytes",
    "peak_live_seq",
    "peak_requested_bytes",
    "peak_reserved_bytes",
    "peak_reserved_seq",
    "max_external_fragmentation",
    "min_largest_free_block",
    "jw1",
    "jw2",
    "jw3",
    "jw4",
    "oom_events",
    "handled_ooms",
    "leaked_bytes",
    "leaked_blocks",
    "device_total_bytes",
    "device_free_at_start_bytes",
    "overhead_bytes",
    "limit_bytes",
    "limit_kind",
)
LABELS = {
    "jw1": "jw1: time-averaged reserved over requested, minus 1",
    "jw2": "jw2: reserved over requested at peak requested, minus 1",
    "jw3": "jw3: reserved over requested at peak reserved, minus 1",
    "jw4": "jw4: peak reserved over peak requested, minus 1",
}
OOM_KEYS = (
    "seq",
    "t_ns",
    "device",
    "handled",
    "size",
    "rounded",
    "site",
    "live_bytes",
    "reserved_bytes",
    "free_in_pool",
    "largest_free_block",
    "diagnosis",
)
MAX_OOM_ROWS = 200


def label(key: str) -> str:
    """A summary key as row text: its own words, with the key itself kept for searching."""
    return LABELS.get(key, key.replace("_", " ")) + f"  [{key}]"


def header(trace: Trace, summary: dict[str, Any]) -> str:
    """Trace facts and the verdict in one box: the OOM's diagnosis and explanation, or that none occurred."""
    m = trace.meta
    dev = m.device
    facts = [
        ["trace", str(trace.path)],
        ["source", m.source.value],
        ["recorded", m.created_utc or "n/a"],
        ["device", f"{dev.name or 'unknown'}, {format_size(dev.total_bytes)} total" if dev else "unknown"],
        ["pool limit", format_size(m.pool_limit_bytes) if m.pool_limit_bytes else "none recorded"],
        ["command", m.command or "n/a"],
    ]
    if trace.dropped:
        facts.append(["skipped events", f"{trace.dropped:,} inconsistent events were skipped"])
    oom = summary.get("oom")
    if oom:
        fate = ("the program survived it and every other OOM" if oom.get("handled")
                else "the program died of it")
        verdict = (
            f'<div class="verdict"><b>Out of memory on device {esc(oom.get("device", 0))}: '
            f'{esc(oom.get("diagnosis", "?"))}</b> ({esc(fate)}). {esc(oom.get("explanation", ""))}'
            f"{esc(handled_text(summary))}</div>"
        )
    else:
        verdict = '<div class="ok"><b>No out-of-memory event in this trace.</b></div>'
    return verdict + "\n" + table(facts)


def handled_text(summary: dict[str, Any]) -> str:
    """" N other OOMs were handled: 33 at SITE (who), …" — empty with one OOM."""
    n = int(summary.get("oom_events") or 0)
    if n < 2:
        return ""
    handled = int(summary.get("handled_ooms") or 0)
    by = [handled_line(h).replace(" x ", " at ", 1) for h in summary.get("handled_by") or []][:5]
    return f" {n} OOMs in all, {handled} handled" + (": " + "; ".join(by) if by else "") + "."


def _free_row(oom: dict[str, Any]) -> list[str]:
    """The device's free memory at the OOM, labelled by how it was had; a derived one is not called free."""
    src = oom.get("device_free_source")
    v = oom.get("device_free_bytes", oom.get("device_free"))
    if src == "measured":
        return ["device free (measured at the OOM)", fmt_value("device_free", v)]
    if src == "derived" and v is not None:
        return ["free at start - the pool's growth (derived; the device was not measured)",
                fmt_value("device_free", v)]
    return ["device free", "not recorded"]


def oom_list_section(summary: dict[str, Any]) -> str:
    """Every OOM: seq, device, size, call-site, diagnosis, and whether the program survived it."""
    ooms = summary.get("ooms") or []
    if len(ooms) < 2:
        return ""
    rows = [[str(o["seq"]), str(o.get("device", 0)), fmt_value("size", o.get("rounded")),
             o.get("site") or "(no call-site)", str(o.get("diagnosis")),
             "handled" if o.get("handled") else "FATAL"] for o in ooms[:MAX_OOM_ROWS]]
    extra = len(ooms) - MAX_OOM_ROWS
    more = f"<p>… and {extra} more (JSON lists them all).</p>" if extra > 0 else ""
    return "\n".join(['<h2 id="ooms">Every OOM</h2>', f"<p>{esc(handled_text(summary).strip())}</p>",
                      table(rows, ["seq", "device", "request", "call-site", "diagnosis", "fate"], (0, 1, 2)),
                      more])


def budget_section(oom: dict[str, Any]) -> str:
    """The device budget at start and at the OOM, term by term, each figure with how it was had."""
    b = oom.get("budget")
    if not b or not b.get("terms"):
        return ""
    rows = []
    for t in b["terms"]:
        if t.get("start_bytes") is None and t.get("oom_bytes") is None:
            continue
        how = t["how_start"] if t["how_start"] == t["how_oom"] else f"{t['how_start']} / {t['how_oom']}"
        change = t.get("change_bytes")
        indent = "\u2003" * int(t.get("level") or 0)
        rows.append([indent + t["name"], fmt_value("bytes", t.get("start_bytes")),
                     fmt_value("bytes", t.get("oom_bytes")),
                     "" if not change else ("+" if change > 0 else "-") + fmt_value("bytes", abs(change)),
                     how, t.get("why", "")])
    return "\n".join(['<h2 id="budget">The device at start and at the OOM</h2>',
                      table(rows, ["term", "at start", "at the OOM", "change", "how", "why"], (1, 2, 3))])


def _site_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [r.get("site") or "(no call-site)", fmt_value("bytes", r["bytes"]), f"{r['blocks']:,}"] for r in rows
    ]


def summary_section(summary: dict[str, Any]) -> str:
    """Summary metrics, the OOM event's fields and its top live call-sites, and the leaks, as tables."""
    parts = ['<h2 id="summary">Summary</h2>']
    parts.append(
        table(
            [[label(k), fmt_value(k, summary.get(k))] for k in SUMMARY_KEYS if k in summary],
            ["metric", "value"],
            (1,),
        )
    )
    oom = summary.get("oom")
    if oom:
        parts.append('<h2 id="oom">The failing allocation</h2>')
        fields = [[k, fmt_value(k, oom.get(k))] for k in OOM_KEYS if k in oom] + [_free_row(oom)]
        parts.append(table(fields, ["field", "value"]))
        if oom.get("top_live_sites"):
            parts.append("<p>Call-sites holding the most live bytes at that moment:</p>")
            parts.append(
                table(_site_rows(oom["top_live_sites"][:15]), ["call-site", "bytes", "blocks"], (1, 2))
            )
    if oom:
        parts.append(budget_section(oom))
    parts.append(oom_list_section(summary))
    leaks = summary.get("leaks") or []
    parts.append('<h2 id="leaks">Blocks never freed</h2>')
    if leaks:
        parts.append(table(_site_rows(leaks[:25]), ["call-site", "bytes", "blocks"], (1, 2)))
        if len(leaks) > 25:
            parts.append(f"<p>… and {len(leaks) - 25} more call-sites.</p>")
    else:
        parts.append("<p>Every block was freed by the end of the trace.</p>")
    return "\n".join(parts)


# Devices drawn and tabled one by one; a trace of more (the format allows 32,768) shows these and
# says how many more there are, so the report's time and size do not grow with the device count.
MAX_SHOWN_DEVICES = 8


def shown_devices(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-device summaries a report shows, at most ``MAX_SHOWN_DEVICES``: the reported
    device first, then those with an OOM (the first OOM first), then the highest peak reserved."""
    parts = list(summary.get("devices") or [])

    def rank(p: dict[str, Any]) -> tuple[int, int, int]:
        oom = p.get("oom")
        return (p.get("device") != summary.get("device"), oom is None,
                int(oom["seq"]) if oom else -int(p.get("peak_reserved_bytes") or 0))

    chosen = sorted(parts, key=rank)[:MAX_SHOWN_DEVICES]
    return sorted(chosen, key=lambda p: int(p["device"]))


def devices_section(summary: dict[str, Any]) -> str:
    """A trace of several devices: every device's own figures side by side (empty otherwise); of
    more than ``MAX_SHOWN_DEVICES`` devices, those ``shown_devices`` picks and a line on the rest."""
    every = summary.get("devices") or []
    if not every:
        return ""
    parts = shown_devices(summary)
    more = len(every) - len(parts)
    rest = (f"<p>{more:,} more devices are not shown (the report shows the device of the reported OOM, "
            "those with an OOM and the highest peaks); <code>tracekit analyze --json</code> lists every "
            "one.</p>") if more else ""
    keys = [k for k in SUMMARY_KEYS if any(k in p for p in parts)]
    rows = [[label(k), *(fmt_value(k, p.get(k)) for p in parts)] for k in keys]
    rows.append(["oom", *(f"{p['oom']['diagnosis']} at seq {p['oom']['seq']}" if p.get("oom") else "none"
                          for p in parts)])
    head = ["metric", *(f"device {p['device']}" for p in parts)]
    return "\n".join(['<h2 id="devices">Each device on its own</h2>',
                      "<p>Every device has its own memory, pool, limit and timeline; none is merged "
                      "with another. The summary above is the device of the reported OOM.</p>", rest,
                      table(rows, head, tuple(range(1, len(head))))])


def baseline_section(
    fig_html: str, this: dict[str, Any], base: dict[str, Any], names: tuple[str, str]
) -> str:
    """The overlay figure and both summaries side by side, with the OOM verdict of each."""
    rows = [
        [label(k), fmt_value(k, this.get(k)), fmt_value(k, base.get(k))]
        for k in SUMMARY_KEYS
        if k in this or k in base
    ]
    oom_row = ["oom"] + [
        f"{o['diagnosis']} at seq {o['seq']}" if o else "none" for o in (this.get("oom"), base.get("oom"))
    ]
    return "\n".join(
        [fig_html, table([*rows, oom_row], ["metric", names[0], f"baseline: {names[1]}"], (1, 2))]
    )


def load_whatif(whatif: Any) -> dict[str, Any]:
    """A what-if result as a dict: an object with ``to_dict()``, a dict, or a path to its JSON.

    A file that is not ``tracekit whatif --json`` output raises InputError naming it and the cause.
    """
    if hasattr(whatif, "to_dict"):
        return dict(whatif.to_dict())
    if isinstance(whatif, dict):
        return whatif
    path = Path(whatif)
    d = load_json_file(path, "what-if JSON")  # the input policy: regular file, bounded size and depth
    if not isinstance(d, dict):
        raise InputError(
            f"{path}: expected the JSON object `tracekit whatif --json` prints, found a {type(d).__name__}"
        )
    pol = d.get("policies", [])
    if not isinstance(pol, list) or not all(isinstance(r, dict) for r in pol):
        raise InputError(f"{path}: 'policies' must be a list of objects, as `tracekit whatif --json` prints")
    numbers = [("lower_bound_bytes", d.get("lower_bound_bytes"))]
    numbers += [(f"policies[{i}].{k}", r.get(k)) for i, r in enumerate(pol)
                for k in ("min_capacity_bytes", "capacity_bytes", "overhead_ratio", "overhead",
                          "searched_up_to_bytes")]
    for key, v in numbers:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not -2**62 < v < 2**62):
            raise InputError(
                f"{path}: '{key}' must be a number below 2^62 or null, found {json.dumps(v)[:40]}")
    return d


def whatif_section(whatif: Any) -> tuple[str, Figure | None]:
    """Table of per-policy smallest capacities (and the figure, when the result has any)."""
    from tracekit.report.figures import draw_whatif

    d = load_whatif(whatif)
    rows = whatif_rows(d)
    bound = d.get("lower_bound_bytes")
    parts = ['<h2 id="whatif-table">What-if capacities</h2>']
    if bound is not None:
        parts.append(f"<p>Lower bound (peak live bytes, 512 B rounded): {esc(fmt_value('bytes', bound))}</p>")
    for p in d.get("devices") or []:
        if isinstance(p, dict):
            lb = fmt_value("bytes", p.get("lower_bound_bytes"))
            parts.append(f"<p>Device {esc(p.get('device'))}: lower bound (peak live bytes, 512 B rounded) "
                         f"{esc(lb)}; each device is searched on its own.</p>")
    parts.append(
        table(
            [
                [
                    r["policy"],
                    fmt_value("bytes", r["capacity_bytes"]),
                    "n/a" if r["overhead"] is None else f"{100 * r['overhead']:.1f}%",
                    r["note"],
                ]
                for r in rows
            ],
            ["policy", "smallest capacity without OOM", "over the lower bound", "note"],
            (1, 2),
        )
    )
    return "\n".join(parts), (draw_whatif(rows, bound) if rows else None)


def whatif_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The what-if policies as ``[{policy, capacity_bytes, overhead, note}]``; ``overhead`` is a ratio.

    A result of several devices gives every device's rows, the policy named "device N: POLICY".
    """
    parts = d.get("devices")
    if isinstance(parts, list) and parts:
        return [{**r, "policy": f"device {p.get('device')}: {r['policy']}"}
                for p in parts if isinstance(p, dict) for r in whatif_rows(p)]
    rows = []
    for r in d.get("policies") or []:
        cap = r.get("min_capacity_bytes", r.get("capacity_bytes"))
        note = r.get("error") or (
            f"no fit up to {fmt_value('bytes', r['searched_up_to_bytes'])}"
            if cap is None and r.get("searched_up_to_bytes")
            else ""
        )
        rows.append(
            {
                "policy": str(r.get("policy")),
                "capacity_bytes": cap,
                "overhead": r.get("overhead_ratio", r.get("overhead")),
                "note": note,
            }
        )
    return rows
