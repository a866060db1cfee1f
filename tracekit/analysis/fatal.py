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

import numpy as np

from tracekit.trace.events import Events
from tracekit.trace.schema import Op

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


