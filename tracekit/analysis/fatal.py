"""Which OOM the program died of, and which ones it survived (and who handled them).

The fatal OOM, in order of evidence:

1. ``exit.oom_seq`` (trace format v2): the ``oom`` row whose error ended the program;
2. a version 1 ``exit`` whose message is the message of an ``ooms`` entry: that entry's seq;
3. an ``exit`` saying the program ended normally, by a signal, or by an exception that is
   not an out-of-memory error: none, every OOM was survived;
4. otherwise: the last OOM after which the program made no successful allocation on the
   same device and stream (a program that went on allocating there survived the error).

Every other OOM is *handled* (``handled_rows``: what every live-bytes figure and every
replay leaves out of what the program needed). Handled OOMs are grouped by call-site (the
label of their stack: the user's line and the request's line, ``tracekit.trace.callsite``);
a request whose frames (the request frame and the frames inside it, which handled the error)
name a library known to retry with less memory (cuDNN trying smaller convolution
workspaces, cuBLAS, cuFFT plans) says so, and so does the trace itself when the next
allocation on the OOM's device and stream came from the same call-site and asked for
less (the caller retried smaller).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tracekit.analysis.recording import exit_info, v1_oom_seq
from tracekit.trace.events import Events
from tracekit.trace.schema import Op

MASKED_KEYS = 8  # distinct (device, stream) pairs of the OOMs searched with one mask each

# (substring of a call-site, lower case) -> who handles an OOM there, in words.
HANDLERS: tuple[tuple[str, str], ...] = (
    ("cudnn", "cuDNN trying smaller workspaces"),
    ("conv", "convolution workspace attempts (cuDNN falls back to an algorithm needing less)"),
    ("cublas", "cuBLAS workspace attempts"),
    ("fft", "cuFFT plan attempts"),
)


RETRIED = "the caller retried with a smaller request at the same call-site"
LOOKAHEAD = 64  # mallocs after an OOM searched for the next one on its device and stream


def handler(site: str | None, retried: bool = False) -> str | None:
    """Who handles an OOM raised at ``site`` (the text of the frames that made the request),
    where those frames (or the retry) show it."""
    low = (site or "").lower()
    return next((who for key, who in HANDLERS if key in low), RETRIED if retried else None)


def retried_smaller(ev: Events, k: int, site: np.ndarray | None = None) -> bool:
    """The next malloc on OOM row k's device and stream is from its call-site and smaller;
    ``site``: each event's call-site id (default ``ev.site``; analyze gives its stack's label)."""
    site = ev.site if site is None else site
    mallocs = np.flatnonzero(ev.op[k + 1: k + 1 + 16 * LOOKAHEAD] == Op.MALLOC) + k + 1
    same = mallocs[(ev.device[mallocs] == ev.device[k]) & (ev.stream[mallocs] == ev.stream[k])][:1]
    return bool(len(same) and site[k] >= 0 and site[same[0]] == site[k]
                and ev.size[same[0]] < ev.size[k])


def fatal_seq(ev: Events, extra: Mapping[str, Any]) -> int | None:
    """The seq of the OOM the program died of, or None when it survived every OOM."""
    ooms = np.flatnonzero(ev.op == Op.OOM)
    if len(ooms) == 0:
        return None
    seqs = ev.seq[ooms]
    ex = exit_info(extra)
    if ex is not None:
        for s in (ex.oom_seq, v1_oom_seq(extra, ex)):
            if s is not None and s >= 0 and np.any(seqs == np.uint64(s)):
                return s
        if ex.survived:
            return None
    stuck = ooms[~_went_on(ev, ooms)]
    return int(ev.seq[stuck[-1]]) if len(stuck) else None


def _went_on(ev: Events, ooms: np.ndarray) -> np.ndarray:
    """For each OOM index: a successful malloc on its device and stream came later.

    Only mallocs after the first OOM matter; the last one per (device, stream) is found
    with one mask per distinct key of the OOMs (a few), else by sorting the keys.
    """
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    mallocs = mallocs[mallocs > ooms[0]]
    odev, ostream = ev.device[ooms].astype(np.int64), ev.stream[ooms].view(np.int64)
    mdev, mstream = ev.device[mallocs].astype(np.int64), ev.stream[mallocs].view(np.int64)
    okeys, inverse = np.unique(np.stack([odev, ostream], axis=1), axis=0, return_inverse=True)
    if len(okeys) <= MASKED_KEYS:
        last = np.array([mallocs[(mdev == d) & (mstream == s)].max(initial=-1) for d, s in okeys], np.int64)
        return last[inverse.reshape(-1)] > ooms
    keys = np.stack([np.r_[mdev, odev], np.r_[mstream, ostream]], axis=1)
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    per_group = np.full(int(group.max()) + 1, -1, np.int64)
    np.maximum.at(per_group, group[: len(mallocs)], mallocs)
    return per_group[group[len(mallocs):]] > ooms


def handled_rows(ev: Events, extra: Mapping[str, Any]) -> np.ndarray:
    """Bool per event: the ``oom`` rows the program survived (every one but the fatal OOM).

    What the program did instead of such a request is in the trace after it (a smaller
    retry, another algorithm, nothing at all), so the request is not part of what the
    program needed: it lives no longer than the retry that replaced it, or not at all.
    """
    oom = ev.op == Op.OOM
    if not oom.any():
        return oom
    fatal = fatal_seq(ev, extra)
    return oom if fatal is None else oom & (ev.seq != np.uint64(fatal))
