"""The limit test of the pool models whose limit enters a replay nowhere else (CuPy's pool, the
device allocators, PyTorch's caching allocator without a GC threshold).

Each test notes what it saw in the kernel's state vector: the most it was asked (``asked``), the
most it let through (``passed``) and the least it refused (``refused``, 0 while none was). At
every limit from ``passed`` up to below ``refused`` every test of the run has the same outcome, so
the run makes the same steps there (what a device model reports of the free space at an OOM is
measured against the limit itself, and differs); a run that refused nothing is, from ``asked``
up, the run without a limit. Those become ``Stat.ASKED``, ``Stat.SAME_FROM`` and
``Stat.SAME_BELOW``, from which advise's bisections take answers without replaying
(``tracekit.advise.bisection``).
"""

from __future__ import annotations

from tracekit.compiled import plain


@plain(inline="always")
def passes(S, value, limit, asked, passed, refused):  # pragma: no cover - compiled
    """Whether ``value`` bytes pass the test ``value <= limit`` (limit <= 0: no limit, all pass);
    ``asked``, ``passed``, ``refused``: the slots of ``S`` that note it."""
    if value > S[asked]:
        S[asked] = value
    if limit > 0 and value > limit:
        if S[refused] == 0 or value < S[refused]:
            S[refused] = value
        return False
    if value > S[passed]:
        S[passed] = value
    return True
