"""Which OOM the program died of, and which ones it survived (and who handled them).

The fatal OOM, in order of evidence:

1. ``exit.oom_seq`` (trace format v2): the ``oom`` row whose error ended the program;
2. a version 1 ``exit`` whose message is the message of an ``ooms`` entry: that entry's seq;
3. an ``exit`` saying the program ended normally, by a signal, or by an exception that is
   not an out-of-memory error: none, every OOM was survived;
4. otherwise: the last OOM after which the program made no successful allocation on the
   same device and stream (a program that went on allocating there survived the error).

Every other OOM is *handled*. Handled OOMs are grouped by call-site; a call-site that
names a library known to retry with less memory (cuDNN trying smaller convolution
workspaces, cuBLAS, cuFFT plans) says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tracekit.analysis.recording import exit_info, v1_oom_seq
from tracekit.trace.events import Events
from tracekit.trace.schema import Op

# (substring of a call-site, lower case) -> who handles an OOM there, in words.
HANDLERS: tuple[tuple[str, str], ...] = (
    ("cudnn", "cuDNN trying smaller workspaces"),
    ("conv", "convolution workspace attempts (cuDNN falls back to an algorithm needing less)"),
    ("cublas", "cuBLAS workspace attempts"),
    ("fft", "cuFFT plan attempts"),
)


def handler(site: str | None) -> str | None:
    """Who handles an OOM raised at ``site``, where the call-site shows it."""
    low = (site or "").lower()
    return next((who for key, who in HANDLERS if key in low), None)


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
    """For each OOM index: a successful malloc on its device and stream came later."""
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    rows = np.r_[mallocs, ooms]
    keys = np.stack([ev.device[rows].astype(np.int64), ev.stream[rows].view(np.int64)], axis=1)
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    last = np.full(int(group.max()) + 1 if len(group) else 0, -1, np.int64)
    np.maximum.at(last, group[: len(mallocs)], mallocs)
    return last[group[len(mallocs):]] > ooms
