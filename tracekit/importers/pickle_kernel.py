# mypy: disable-error-code="assignment"
"""The compiled pass of the snapshot scanner (``pickle_scan``): pickle opcodes in, flat arrays out.

``_scan`` walks the bytes once with a value stack and a memo of ``(tag, a, b)``
triples (``Tag``): ints and floats are stored in ``a``, strings and bytes as
``(offset, length)`` into the buffer, containers as node ids. Each opcode
belongs to one family (``Family``, looked up in ``FAMILY``) and each family is
one short function below:

- scalars (``_scalar``): None, bools, ints, floats, strings and bytes, pushed;
- the memo (``_memo_put``, ``_memo_get``);
- new containers (``_new_node``) and tuples (``_tuple``);
- list items (``_append``): a frame goes into its stack (first frame, innermost
  frame outside PyTorch, count, and the stack's node in a trie of frames,
  ``Tr``, interned as the scan goes: one node per distinct stack prefix), a
  history entry into its device's list, any other value becomes an edge;
- dict items (``_setitems``): the first keys decide what a dict is
  (``_classify``: an ``action`` key makes a history entry, one row of ``en``
  with the columns ``En``; a ``filename`` key a frame, one row of ``fr`` with
  the columns ``Fr``, classified as PyTorch's own or not as
  ``torch_stacks.is_torch_file`` does); any other dict's items are edges.

Every read is bounds-checked against the buffer and every array has a fixed
capacity (``Cap``), so no input can make it read or write out of range. The
result's status (``Status``): ``DONE`` a complete snapshot, ``BROKEN`` an opcode
or shape outside the subset (or a broken stream), ``FULL`` a capacity too small
(the caller retries with more).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numba import njit


class Tag(IntEnum):
    """What a value on the stack or in the memo is, and so what its ``a`` and ``b`` hold."""

    NONE = 0
    BOOL = 1  # a: 0 or 1
    INT = 2  # a: the value (int64)
    FLOAT = 3  # a: the IEEE-754 bits, big-endian as pickled
    STR = 4  # a, b: offset and length of the UTF-8 bytes in the buffer
    BYTES = 5  # a, b: offset and length
    OBJ = 6  # a: a node id (a container)
    BIGINT = 7  # a, b: offset and length of a little-endian int wider than 64 bits


class Kind(IntEnum):
    """What a container node is (``nd_kind``)."""

    DICT = 1
    LIST = 2
    TUPLE = 3
    ENTRY = 4  # a dict with an ``action`` key: a history entry, row ``Nd.AUX`` of ``en``
    FRAME = 5  # a dict with a ``filename`` key: a stack frame, row ``Nd.AUX`` of ``fr``


class Status(IntEnum):
    """How a scan ended (``RUNNING``: not yet, the value a family function returns to go on)."""

    DONE = 0
    BROKEN = 1
    FULL = 2
    RUNNING = 3


class Cap(IntEnum):
    """Indices into ``caps``: the capacity of each array."""

    STACK = 0
    MARKS = 1
    MEMO = 2
    NODES = 3
    EDGES = 4
    ENTRIES = 5
    FRAMES = 6
    TRIE = 7


class Tr(IntEnum):
    """The columns of ``tr``: the frames of every stack as a trie grown from the innermost frame.
    Node ``t`` is frame row ``FRAME`` called from outside node ``INNER``'s frames (-1: ``FRAME`` is
    the innermost), so a stack's node, walked through ``INNER``, gives its frames outermost first."""

    FRAME = 0
    INNER = 1
    N = 2


class Sv(IntEnum):
    """The columns of the value stack ``st``: a value as (tag, a, b)."""

    TAG = 0
    A = 1
    B = 2
    N = 3


class Nd(IntEnum):
    """The columns of ``nd``, one row per container node."""

    KIND = 0  # Kind
    AUX = 1  # ENTRY: its row of ``en``; FRAME: its row of ``fr``; else -1
    FIRST = 2  # a stack (a list of frames): its first frame's row of ``fr``, -1 none
    SITE = 3  # a stack: its innermost frame outside PyTorch, -1 none
    N_FRAMES = 4  # a stack: how many frames it holds
    N_ENTRIES = 5  # a device's history: how many entries it holds
    N_EDGES = 6  # how many items it holds as edges
    STACK = 7  # a stack: the trie node of its frames so far (see ``Tr``), -1 none
    N = 8


class Ed(IntEnum):
    """The columns of ``ed``, one row per item of a container that is neither a frame nor an entry."""

    PARENT = 0  # the container's node id
    KEY_TAG = 1  # the key's Tag, -1 for a list or tuple item
    KEY_A = 2
    KEY_B = 3
    VALUE_TAG = 4
    VALUE_A = 5
    VALUE_B = 6
    N = 7


class En(IntEnum):
    """The columns of ``en``, one row per history entry."""

    ACTION = 0  # the action code (ACTION_CODES), -1 an unknown name, -2 no action string
    ACTION_OFF = 1  # the action name's offset and length in the buffer
    ACTION_LEN = 2
    ADDR = 3
    SIZE = 4
    STREAM = 5
    TIME_US = 6
    HAS_TIME = 7  # 1 when time_us is an int, 0 when None or absent
    DEVICE_FREE = 8  # -1 when absent
    FRAMES = 9  # the node id of its frames list, -1 none
    LIST = 10  # the node id of the device list holding it, -1 none yet
    N = 11


class Fr(IntEnum):
    """The columns of ``fr``, one row per frame dict."""

    FILE_OFF = 0
    FILE_LEN = 1
    LINE = 2  # the line, or the offset of its bytes when BIG
    NAME_OFF = 3
    NAME_LEN = 4
    TORCH = 5  # 1: PyTorch's own or native (never the call-site)
    BIG = 6  # 1: the line is an int wider than 64 bits (decoded in Python)
    LINE_LEN = 7  # the byte length of a BIG line
    N = 8


class Lit(IntEnum):
    """Indices of the literals in ``LITS``: the keys, then the action names, then the patterns."""

    ACTION = 0
    ADDR = 1
    SIZE = 2
    STREAM = 3
    TIME_US = 4
    DEVICE_FREE = 5
    FRAMES = 6
    FILENAME = 7
    LINE = 8
    NAME = 9
    FIRST_ACTION = 10  # ACTION_NAMES follow the keys
    FIRST_PATTERN = 19  # TORCH_PATTERNS follow the action names


class Op(IntEnum):
    """The pickle opcodes of the subset (``pickletools`` names)."""

    FRAME = 0x95
    STOP = 0x2E
    MARK = 0x28
    EMPTY_DICT = 0x7D
    EMPTY_LIST = 0x5D
    EMPTY_TUPLE = 0x29
    NONE = 0x4E
    NEWTRUE = 0x88
    NEWFALSE = 0x89
    BININT = 0x4A
    BININT1 = 0x4B
    BININT2 = 0x4D
    LONG1 = 0x8A
    BINFLOAT = 0x47
    SHORT_BINUNICODE = 0x8C
    SHORT_BINBYTES = 0x43
    BINUNICODE = 0x58
    BINBYTES = 0x42
    BINUNICODE8 = 0x8D
    BINBYTES8 = 0x8E
    MEMOIZE = 0x94
    BINPUT = 0x71
    LONG_BINPUT = 0x72
    BINGET = 0x68
    LONG_BINGET = 0x6A
    TUPLE1 = 0x85
    TUPLE2 = 0x86
    TUPLE3 = 0x87
    TUPLE = 0x74
    APPEND = 0x61
    APPENDS = 0x65
    SETITEM = 0x73
    SETITEMS = 0x75


class Family(IntEnum):
    """Opcodes handled alike (``FAMILY[op]``); ``OTHER``: outside the subset."""

    OTHER = 0
    FRAMING = 1
    STOP = 2
    MARK = 3
    SCALAR = 4
    EMPTY = 5
    MEMO_PUT = 6
    MEMO_GET = 7
    TUPLE = 8
    APPEND = 9
    SETITEM = 10


KEYS = (b"action", b"addr", b"size", b"stream", b"time_us", b"device_free", b"frames",
        b"filename", b"line", b"name")
ACTION_NAMES = (b"alloc", b"free_requested", b"free_completed", b"segment_alloc", b"segment_free",
                b"segment_map", b"segment_unmap", b"oom", b"free")
ACTION_CODES = np.array([0, 1, 2, 3, 4, 5, 6, 7, 2], dtype=np.int8)  # torch_columns' codes; free = completed
# Separator-agnostic patterns of PyTorch's own files (0 stands for '/' or '\\').
TORCH_PATTERNS = (b"\0site-packages\0torch\0", b"\0dist-packages\0torch\0", b"\0pytorch\0torch\0")
N_KEYS, N_ACTIONS = len(KEYS), len(ACTION_NAMES)
assert Lit.FIRST_ACTION == N_KEYS and Lit.FIRST_PATTERN == N_KEYS + N_ACTIONS


def _pack(items: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
    data = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
    off = np.cumsum([0] + [len(i) for i in items]).astype(np.int64)
    return data, off


LITS, LIT_OFF = _pack(KEYS + ACTION_NAMES + TORCH_PATTERNS)
ARGLEN = np.zeros(256, dtype=np.int64)  # fixed argument bytes per opcode (the rest is checked where read)
for _op, _n in ((Op.FRAME, 8), (Op.BININT, 4), (Op.BININT1, 1), (Op.BININT2, 2), (Op.LONG1, 1),
                (Op.BINFLOAT, 8), (Op.SHORT_BINUNICODE, 1), (Op.SHORT_BINBYTES, 1), (Op.BINUNICODE, 4),
                (Op.BINBYTES, 4), (Op.BINUNICODE8, 8), (Op.BINBYTES8, 8), (Op.BINPUT, 1),
                (Op.LONG_BINPUT, 4), (Op.BINGET, 1), (Op.LONG_BINGET, 4)):
    ARGLEN[_op] = _n
FAMILY = np.zeros(256, dtype=np.int8)
for _fam, _ops in (
        (Family.FRAMING, (Op.FRAME,)), (Family.STOP, (Op.STOP,)), (Family.MARK, (Op.MARK,)),
        (Family.SCALAR, (Op.NONE, Op.NEWTRUE, Op.NEWFALSE, Op.BININT, Op.BININT1, Op.BININT2, Op.LONG1,
                         Op.BINFLOAT, Op.SHORT_BINUNICODE, Op.SHORT_BINBYTES, Op.BINUNICODE, Op.BINBYTES,
                         Op.BINUNICODE8, Op.BINBYTES8)),
        (Family.EMPTY, (Op.EMPTY_DICT, Op.EMPTY_LIST, Op.EMPTY_TUPLE)),
        (Family.MEMO_PUT, (Op.MEMOIZE, Op.BINPUT, Op.LONG_BINPUT)),
        (Family.MEMO_GET, (Op.BINGET, Op.LONG_BINGET)),
        (Family.TUPLE, (Op.TUPLE1, Op.TUPLE2, Op.TUPLE3, Op.TUPLE)),
        (Family.APPEND, (Op.APPEND, Op.APPENDS)), (Family.SETITEM, (Op.SETITEM, Op.SETITEMS))):
    for _op in _ops:
        FAMILY[_op] = _fam
SLASH, BACKSLASH = 0x2F, 0x5C
MAX_DEPTH = 4096  # frames kept per stack, the innermost ones (torch_stacks keeps the same)


# ---- bytes ----------------------------------------------------------------------------------

@njit(cache=True)
def _eq(buf, off, ln, k):  # pragma: no cover - compiled
    """buf[off:off + ln] equals literal ``k``."""
    a = LIT_OFF[k]
    if LIT_OFF[k + 1] - a != ln:
        return False
    for i in range(ln):  # noqa: SIM110 - compiled loop, no generator
        if buf[off + i] != LITS[a + i]:
            return False
    return True


@njit(cache=True)
def _pat_at(buf, pos, end, k):  # pragma: no cover - compiled
    """Pattern ``k`` (0 = either separator) starts at buf[pos] and ends by ``end``."""
    a, b = LIT_OFF[k], LIT_OFF[k + 1]
    if pos + (b - a) > end:
        return False
    for i in range(b - a):
        c, p = buf[pos + i], LITS[a + i]
        if p == 0:
            if c != SLASH and c != BACKSLASH:
                return False
        elif c != p:
            return False
    return True


@njit(cache=True)
def _ends_with(buf, end, ln, suffix):  # pragma: no cover - compiled
    """The ``ln`` bytes ending at ``end`` end with the ASCII ``suffix``."""
    k = len(suffix)
    if ln < k:
        return False
    for i in range(k):  # noqa: SIM110 - compiled loop, no generator
        if buf[end - k + i] != ord(suffix[i]):
            return False
    return True


@njit(cache=True)
def _is_torch(buf, off, ln):  # pragma: no cover - compiled
    """``torch_stacks.is_torch_file`` on the UTF-8 bytes of a file name: empty or ``??``, not a
    ``.py``/``.pyw`` file or ``<pseudo-file>`` (native), ``torch/...``, or a PyTorch pattern inside."""
    if ln == 0 or (ln == 2 and buf[off] == ord("?") and buf[off + 1] == ord("?")):
        return True
    end = off + ln
    if not (_ends_with(buf, end, ln, ".py") or _ends_with(buf, end, ln, ".pyw") or buf[off] == ord("<")):
        return True
    if ln >= 6 and buf[off] == ord("t") and buf[off + 1] == ord("o") and buf[off + 2] == ord("r") \
            and buf[off + 3] == ord("c") and buf[off + 4] == ord("h") \
            and (buf[off + 5] == SLASH or buf[off + 5] == BACKSLASH):
        return True
    for pos in range(off, end):
        if buf[pos] == SLASH or buf[pos] == BACKSLASH:
            for k in range(Lit.FIRST_PATTERN, Lit.FIRST_PATTERN + len(TORCH_PATTERNS)):
                if _pat_at(buf, pos, end, k):
                    return True
    return False


@njit(cache=True)
def _int_at(buf, pos, n, signed):  # pragma: no cover - compiled
    """The ``n``-byte little-endian integer at buf[pos] (two's complement when ``signed``)."""
    v = np.int64(0)
    for i in range(n):
        v |= np.int64(buf[pos + i]) << np.int64(8 * i)
    if signed and n < 8 and n > 0 and buf[pos + n - 1] >= 128:
        v -= np.int64(1) << np.int64(8 * n)
    return v


# ---- scalars and the memo ---------------------------------------------------------------------

@njit(cache=True)
def _text(buf, n, pos, width, op, str_op):  # pragma: no cover - compiled
    """A string or bytes whose length is the ``width``-byte int at buf[pos]: (step, tag, offset,
    length, pos after it); BROKEN when it runs past the end."""
    k = np.int64(buf[pos]) if width == 1 else _int_at(buf, pos, width, False)
    if k < 0 or pos + width + k > n:
        return Status.BROKEN, -1, np.int64(0), np.int64(0), pos
    return Status.RUNNING, (Tag.STR if op == str_op else Tag.BYTES), pos + width, k, pos + width + k


@njit(cache=True, inline="always")
def _scalar(buf, n, pos, op):  # pragma: no cover - compiled
    """One scalar opcode whose argument starts at buf[pos]: (step, tag, a, b, pos after it)."""
    z = np.int64(0)
    if op == Op.NONE:
        return Status.RUNNING, Tag.NONE, z, z, pos
    if op == Op.NEWTRUE or op == Op.NEWFALSE:
        return Status.RUNNING, Tag.BOOL, np.int64(1 if op == Op.NEWTRUE else 0), z, pos
    if op == Op.BININT:
        return Status.RUNNING, Tag.INT, _int_at(buf, pos, 4, True), z, pos + 4
    if op == Op.BININT1:
        return Status.RUNNING, Tag.INT, np.int64(buf[pos]), z, pos + 1
    if op == Op.BININT2:
        return Status.RUNNING, Tag.INT, _int_at(buf, pos, 2, False), z, pos + 2
    if op == Op.LONG1:
        k = np.int64(buf[pos])
        if pos + 1 + k > n:
            return Status.BROKEN, -1, z, z, pos
        if k > 8:  # beyond int64 (SIZE_MAX in allocator settings): decoded in Python
            return Status.RUNNING, Tag.BIGINT, pos + 1, k, pos + 1 + k
        return Status.RUNNING, Tag.INT, _int_at(buf, pos + 1, k, True), z, pos + 1 + k
    if op == Op.BINFLOAT:  # the big-endian bits, kept as they are
        v = np.int64(0)
        for i in range(8):
            v = (v << np.int64(8)) | np.int64(buf[pos + i])
        return Status.RUNNING, Tag.FLOAT, v, z, pos + 8
    if op == Op.SHORT_BINUNICODE or op == Op.SHORT_BINBYTES:
        return _text(buf, n, pos, 1, op, Op.SHORT_BINUNICODE)
    if op == Op.BINUNICODE or op == Op.BINBYTES:
        return _text(buf, n, pos, 4, op, Op.BINUNICODE)
    return _text(buf, n, pos, 8, op, Op.BINUNICODE8)  # BINUNICODE8, BINBYTES8


@njit(cache=True)
def _memo_index(buf, pos, op, memo_n):  # pragma: no cover - compiled
    """The memo slot an opcode names (MEMOIZE: the next one) and the position after its argument."""
    if op == Op.MEMOIZE:
        return np.int64(memo_n), pos
    if op == Op.BINPUT or op == Op.BINGET:
        return np.int64(buf[pos]), pos + 1
    return _int_at(buf, pos, 4, False), pos + 4


@njit(cache=True)
def _memo_put(buf, n, pos, op, st, sp, mm_t, mm_a, mm_b, memo_n):  # pragma: no cover - compiled
    """MEMOIZE, BINPUT, LONG_BINPUT: the top of the stack into a memo slot (slot tag = value tag + 1,
    so 0 means unset). Returns (step, pos, memo_n)."""
    idx, pos = _memo_index(buf, pos, op, memo_n)
    if sp == 0 or idx > n:
        return Status.BROKEN, pos, memo_n
    if idx >= mm_t.shape[0]:
        return Status.FULL, pos, memo_n
    if mm_t[idx] == 0:
        memo_n += 1
    mm_t[idx], mm_a[idx], mm_b[idx] = st[sp - 1, Sv.TAG] + 1, st[sp - 1, Sv.A], st[sp - 1, Sv.B]
    return Status.RUNNING, pos, memo_n


@njit(cache=True)
def _memo_get(buf, pos, op, mm_t, mm_a, mm_b):  # pragma: no cover - compiled
    """BINGET, LONG_BINGET: (step, tag, a, b, pos) of the memo slot named; BROKEN when unset."""
    idx, pos = _memo_index(buf, pos, op, 0)
    if idx < 0 or idx >= mm_t.shape[0] or mm_t[idx] == 0:
        return Status.BROKEN, -1, np.int64(0), np.int64(0), pos
    return Status.RUNNING, mm_t[idx] - 1, mm_a[idx], mm_b[idx], pos


# ---- containers ---------------------------------------------------------------------------------

@njit(cache=True)
def _init_node(nd, i, kind, n_edges):  # pragma: no cover - compiled
    """Node ``i`` as a fresh container of ``kind`` holding ``n_edges`` edges."""
    nd[i, Nd.KIND] = kind
    nd[i, Nd.AUX] = -1
    nd[i, Nd.FIRST] = -1
    nd[i, Nd.SITE] = -1
    nd[i, Nd.N_FRAMES] = 0
    nd[i, Nd.N_ENTRIES] = 0
    nd[i, Nd.N_EDGES] = n_edges
    nd[i, Nd.STACK] = -1


@njit(cache=True)
def _new_node(nd, nn, op):  # pragma: no cover - compiled
    """EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE: (step, nn) with node ``nn`` made."""
    if nn + 1 >= nd.shape[0]:
        return Status.FULL, nn
    _init_node(nd, nn, Kind.DICT if op == Op.EMPTY_DICT else (Kind.LIST if op == Op.EMPTY_LIST
                                                             else Kind.TUPLE), 0)
    return Status.RUNNING, nn + 1


@njit(cache=True)
def _items_from(op, many, marks, mp, sp, per_item):  # pragma: no cover - compiled
    """Where an opcode's items start on the stack: at the last mark for the ``many`` form (the mark
    popped), else ``per_item`` below the top. Returns (lo, mp); lo -1 when there is no such mark."""
    if op == many:
        if mp == 0:
            return -1, mp
        mp -= 1
        lo = marks[mp]
        return (lo if lo <= sp else -1), mp
    return sp - per_item, mp


@njit(cache=True)
def _edge(ed, ne, parent, st, k, v):  # pragma: no cover - compiled
    """Edge ``ne``: an item of container ``parent``, its key the stack value ``st[k]`` (k -1: a list or
    tuple item, key tag -1) and its value ``st[v]``."""
    ed[ne, Ed.PARENT] = parent
    if k < 0:
        ed[ne, Ed.KEY_TAG], ed[ne, Ed.KEY_A], ed[ne, Ed.KEY_B] = -1, 0, 0
    else:
        ed[ne, Ed.KEY_TAG], ed[ne, Ed.KEY_A], ed[ne, Ed.KEY_B] = st[k, Sv.TAG], st[k, Sv.A], st[k, Sv.B]
    ed[ne, Ed.VALUE_TAG], ed[ne, Ed.VALUE_A], ed[ne, Ed.VALUE_B] = st[v, Sv.TAG], st[v, Sv.A], st[v, Sv.B]


@njit(cache=True, inline="always")
def _tuple(op, st, sp, marks, mp, nd, nn, ed, ne):  # pragma: no cover - compiled
    """TUPLE1/2/3, TUPLE: the items become a tuple node. Returns (step, sp, mp, nn, ne); the caller
    pushes node nn - 1."""
    lo, mp = _items_from(op, Op.TUPLE, marks, mp, sp, op - Op.TUPLE1 + 1)
    if lo < 0:
        return Status.BROKEN, sp, mp, nn, ne
    if nn + 1 >= nd.shape[0]:
        return Status.FULL, sp, mp, nn, ne
    _init_node(nd, nn, Kind.TUPLE, sp - lo)
    if ne + (sp - lo) >= ed.shape[0]:
        return Status.FULL, sp, mp, nn, ne
    for j in range(lo, sp):
        _edge(ed, ne, nn, st, -1, j)
        ne += 1
    return Status.RUNNING, lo, mp, nn + 1, ne


@njit(cache=True)
def _intern(tr, th, nt, frame, inner):  # pragma: no cover - compiled
    """The trie node of frame row ``frame`` outside node ``inner`` (-1: none), made if new: (node,
    nt); node -1 when the trie is full. ``th`` is an open-addressing table of node + 1 (0 empty),
    a power of two at least twice the trie's capacity, so a probe always ends."""
    mask = th.shape[0] - 1
    h = ((np.int64(frame) * 0x9E3779B1) ^ ((np.int64(inner) + 1) * 0x85EBCA6B)) & mask
    while th[h] != 0:
        t = th[h] - 1
        if tr[t, Tr.FRAME] == frame and tr[t, Tr.INNER] == inner:
            return t, nt
        h = (h + 1) & mask
    if nt >= tr.shape[0]:
        return -1, nt
    tr[nt, Tr.FRAME], tr[nt, Tr.INNER] = frame, inner
    th[h] = nt + 1
    return nt, nt + 1


@njit(cache=True)
def _frame_into_stack(nd, fr, tr, th, nt, lst, f):  # pragma: no cover - compiled
    """Frame row ``f`` appended to the stack ``lst``: its first frame and its innermost frame outside
    PyTorch (the call-site), the count, and its trie node (the first MAX_DEPTH frames). Returns
    (ok, nt); not ok when the trie is full."""
    if nd[lst, Nd.FIRST] < 0:
        nd[lst, Nd.FIRST] = f
    if nd[lst, Nd.SITE] < 0 and fr[f, Fr.TORCH] == 0:
        nd[lst, Nd.SITE] = f
    if nd[lst, Nd.N_FRAMES] < MAX_DEPTH:
        t, nt = _intern(tr, th, nt, f, nd[lst, Nd.STACK])
        if t < 0:
            return False, nt
        nd[lst, Nd.STACK] = t
    nd[lst, Nd.N_FRAMES] += 1
    return True, nt


@njit(cache=True, inline="always")
def _append(op, st, sp, marks, mp, nd, ed, ne, en, fr, tr, th, nt):  # pragma: no cover - compiled
    """APPEND, APPENDS: items into the list below them. A frame goes into the list's stack, a history
    entry into the list's history (once only), anything else becomes an edge. Returns (step, sp, mp,
    ne, nt)."""
    lo, mp = _items_from(op, Op.APPENDS, marks, mp, sp, 1)
    if lo < 1 or st[lo - 1, Sv.TAG] != Tag.OBJ or nd[st[lo - 1, Sv.A], Nd.KIND] != Kind.LIST:
        return Status.BROKEN, sp, mp, ne, nt
    lst = st[lo - 1, Sv.A]
    if ne + (sp - lo) >= ed.shape[0]:
        return Status.FULL, sp, mp, ne, nt
    for j in range(lo, sp):
        ct = st[j, Sv.TAG]
        ck = nd[st[j, Sv.A], Nd.KIND] if ct == Tag.OBJ else 0
        if ck == Kind.FRAME:
            ok, nt = _frame_into_stack(nd, fr, tr, th, nt, lst, nd[st[j, Sv.A], Nd.AUX])
            if not ok:
                return Status.FULL, sp, mp, ne, nt
        elif ck == Kind.ENTRY:
            e = nd[st[j, Sv.A], Nd.AUX]
            if en[e, En.LIST] >= 0:  # one entry listed twice
                return Status.BROKEN, sp, mp, ne, nt
            en[e, En.LIST] = lst
            nd[lst, Nd.N_ENTRIES] += 1
        else:
            _edge(ed, ne, lst, st, -1, j)
            ne += 1
            nd[lst, Nd.N_EDGES] += 1
    return Status.RUNNING, lo, mp, ne, nt


# ---- dict items: history entries, frames, plain dicts -----------------------------------------

@njit(cache=True)
def _classify(buf, st, lo, sp):  # pragma: no cover - compiled
    """What a dict's first items make it (as ``nd`` holds it): ENTRY with an ``action`` key, else
    FRAME with a ``filename`` key, else DICT."""
    kind = np.int32(Kind.DICT)
    for j in range(lo, sp, 2):
        if st[j, Sv.TAG] == Tag.STR and _eq(buf, st[j, Sv.A], st[j, Sv.B], Lit.ACTION):
            return np.int32(Kind.ENTRY)
        if st[j, Sv.TAG] == Tag.STR and _eq(buf, st[j, Sv.A], st[j, Sv.B], Lit.FILENAME):
            kind = np.int32(Kind.FRAME)
    return kind


@njit(cache=True)
def _new_entry(en, nen):  # pragma: no cover - compiled
    """Row ``nen`` of ``en`` as an entry with no field yet."""
    en[nen, En.ACTION] = -2
    en[nen, 1:] = 0
    en[nen, En.DEVICE_FREE] = -1
    en[nen, En.FRAMES] = -1
    en[nen, En.LIST] = -1


@njit(cache=True)
def _entry_action(buf, en, e, va, vb):  # pragma: no cover - compiled
    """The ``action`` string at (va, vb): its code (-1 unknown) and where its name is."""
    en[e, En.ACTION] = -1
    en[e, En.ACTION_OFF] = va
    en[e, En.ACTION_LEN] = vb
    for k in range(N_ACTIONS):
        if _eq(buf, va, vb, Lit.FIRST_ACTION + k):
            en[e, En.ACTION] = ACTION_CODES[k]
            break


@njit(cache=True)
def _entry_number(en, e, lit, vt, va):  # pragma: no cover - compiled
    """A numeric field (``lit`` one of ADDR .. DEVICE_FREE); False when its value has the wrong type.
    ``time_us`` None means no clock; addr/size/stream None mean 0 (bools count as ints)."""
    if lit == Lit.TIME_US:
        if vt == Tag.INT:
            en[e, En.TIME_US] = va
            en[e, En.HAS_TIME] = 1
        elif vt == Tag.NONE:
            en[e, En.HAS_TIME] = 0
        else:
            return False
    elif lit == Lit.DEVICE_FREE:
        if vt != Tag.INT:
            return False
        en[e, En.DEVICE_FREE] = va
    elif vt == Tag.INT or vt == Tag.BOOL:
        en[e, En.ADDR + lit - Lit.ADDR] = va
    elif vt == Tag.NONE:
        en[e, En.ADDR + lit - Lit.ADDR] = 0
    else:
        return False
    return True


@njit(cache=True)
def _entry_items(buf, st, lo, sp, nd, en, e):  # pragma: no cover
    """The known keys of history entry ``e`` into its row; False when a value has the wrong type."""
    for j in range(lo, sp, 2):
        if st[j, Sv.TAG] != Tag.STR:
            continue
        ko, kl = st[j, Sv.A], st[j, Sv.B]
        vt, va, vb = st[j + 1, Sv.TAG], st[j + 1, Sv.A], st[j + 1, Sv.B]
        if _eq(buf, ko, kl, Lit.ACTION):
            if vt != Tag.STR:
                return False
            _entry_action(buf, en, e, va, vb)
        elif _eq(buf, ko, kl, Lit.FRAMES):
            if vt == Tag.OBJ and nd[va, Nd.KIND] == Kind.LIST:
                en[e, En.FRAMES] = va
            elif vt != Tag.NONE:
                return False
        else:
            for lit in range(Lit.ADDR, Lit.DEVICE_FREE + 1):
                if _eq(buf, ko, kl, lit):
                    if not _entry_number(en, e, lit, vt, va):
                        return False
                    break
    return True


@njit(cache=True)
def _frame_items(buf, st, lo, sp, fr, f):  # pragma: no cover - compiled
    """``filename``, ``line`` and ``name`` of frame ``f`` into its row; False on a wrong type. A frame
    without a file name counts as PyTorch's (never the call-site)."""
    for j in range(lo, sp, 2):
        if st[j, Sv.TAG] != Tag.STR:
            continue
        ko, kl = st[j, Sv.A], st[j, Sv.B]
        vt, va, vb = st[j + 1, Sv.TAG], st[j + 1, Sv.A], st[j + 1, Sv.B]
        if _eq(buf, ko, kl, Lit.FILENAME):
            if vt != Tag.STR:
                return False
            fr[f, Fr.FILE_OFF], fr[f, Fr.FILE_LEN] = va, vb
            fr[f, Fr.TORCH] = 1 if _is_torch(buf, va, vb) else 0
        elif _eq(buf, ko, kl, Lit.LINE):
            if vt != Tag.INT and vt != Tag.BIGINT:
                return False
            fr[f, Fr.LINE], fr[f, Fr.BIG], fr[f, Fr.LINE_LEN] = va, 1 if vt == Tag.BIGINT else 0, vb
        elif _eq(buf, ko, kl, Lit.NAME):
            if vt != Tag.STR:
                return False
            fr[f, Fr.NAME_OFF], fr[f, Fr.NAME_LEN] = va, vb
    if fr[f, Fr.FILE_LEN] == 0:
        fr[f, Fr.TORCH] = 1
    return True


@njit(cache=True)
def _dict_items(st, lo, sp, nd, d, ed, ne):  # pragma: no cover - compiled
    """A plain dict's items as edges: (step, ne)."""
    if ne + (sp - lo) // 2 >= ed.shape[0]:
        return Status.FULL, ne
    for j in range(lo, sp, 2):
        _edge(ed, ne, d, st, j, j + 1)
        ne += 1
        nd[d, Nd.N_EDGES] += 1
    return Status.RUNNING, ne


@njit(cache=True, inline="always")
def _setitems(buf, op, st, sp, marks, mp, nd, ed, ne, en, nen, fr,
              nfr):  # pragma: no cover - compiled
    """SETITEM, SETITEMS: key/value pairs into the dict below them. A dict's first items decide
    whether it is a history entry (a row of ``en``), a frame (a row of ``fr``) or a plain dict
    (edges). Returns (step, sp, mp, ne, nen, nfr)."""
    lo, mp = _items_from(op, Op.SETITEMS, marks, mp, sp, 2)
    if lo < 1 or (sp - lo) % 2 != 0 or st[lo - 1, Sv.TAG] != Tag.OBJ:
        return Status.BROKEN, sp, mp, ne, nen, nfr
    d = st[lo - 1, Sv.A]
    kind = nd[d, Nd.KIND]
    if kind == Kind.DICT and nd[d, Nd.N_EDGES] == 0:
        kind = _classify(buf, st, lo, sp)
        if kind == Kind.ENTRY:
            if nen >= en.shape[0]:
                return Status.FULL, sp, mp, ne, nen, nfr
            _new_entry(en, nen)
            nd[d, Nd.AUX] = nen
            nen += 1
        elif kind == Kind.FRAME:
            if nfr >= fr.shape[0]:
                return Status.FULL, sp, mp, ne, nen, nfr
            fr[nfr, :] = 0
            nd[d, Nd.AUX] = nfr
            nfr += 1
        nd[d, Nd.KIND] = kind
    if kind == Kind.ENTRY:
        ok = _entry_items(buf, st, lo, sp, nd, en, nd[d, Nd.AUX])
    elif kind == Kind.FRAME:
        ok = _frame_items(buf, st, lo, sp, fr, nd[d, Nd.AUX])
    elif kind == Kind.DICT:
        step, ne = _dict_items(st, lo, sp, nd, d, ed, ne)
        if step != Status.RUNNING:
            return step, sp, mp, ne, nen, nfr
        ok = True
    else:  # items set on a list or a tuple
        ok = False
    if not ok:
        return Status.BROKEN, sp, mp, ne, nen, nfr
    return Status.RUNNING, lo, mp, ne, nen, nfr


# ---- the scan ----------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _scan(buf, progress, caps):  # pragma: no cover - compiled
    """The whole pass: (status, position, stack, nodes, edges, entries, frames, trie) as arrays cut to their
    counts. ``progress[0]`` is set to the bytes scanned now and then; ``progress[1]`` != 0 stops it."""
    # No array is ever reassigned inside the loop (a reassigned array costs reference counting on
    # every iteration); running out of any capacity returns FULL and the caller retries bigger.
    n = buf.shape[0]
    st = np.zeros((caps[Cap.STACK], Sv.N), np.int64)
    marks = np.empty(caps[Cap.MARKS], np.int64)
    # Pages never written are never resident, so generous sizes cost address space only.
    # A memo slot holds tag + 1, so 0 (calloc'd, lazily zeroed) means unset.
    mm_t = np.zeros(caps[Cap.MEMO], np.int8)
    mm_a = np.empty(caps[Cap.MEMO], np.int64)
    mm_b = np.empty(caps[Cap.MEMO], np.int64)
    nd = np.empty((caps[Cap.NODES], Nd.N), np.int32)
    ed = np.empty((caps[Cap.EDGES], Ed.N), np.int64)
    en = np.empty((caps[Cap.ENTRIES], En.N), np.int64)
    fr = np.empty((caps[Cap.FRAMES], Fr.N), np.int64)
    tr = np.empty((caps[Cap.TRIE], Tr.N), np.int32)
    slots = 1
    while slots < 2 * caps[Cap.TRIE]:
        slots *= 2
    th = np.zeros(slots, np.int32)
    sp = mp = memo_n = nn = ne = nen = nfr = nt = 0
    pos = 0
    if n < 2 or buf[0] != 0x80 or buf[1] < 2:  # PROTO 2 or later
        return Status.BROKEN, pos, st[:, Sv.TAG], st[:, Sv.A], st[:, Sv.B], nd[:0], ed[:0], en[:0], fr[:0], \
            tr[:0]
    pos = 2
    status = Status.BROKEN
    while pos < n:
        if (pos & 0xFFFFF) < 64:
            progress[0] = pos
            if progress[1] != 0:  # the caller was interrupted: stop, it will not read the result
                break
        op = buf[pos]
        pos += 1
        if pos + ARGLEN[op] > n:
            break  # truncated
        if sp + 4 >= st.shape[0]:
            status = Status.FULL
            break
        fam = FAMILY[op]
        t, a, b = -1, np.int64(0), np.int64(0)  # a value to push, if t >= 0
        step = Status.RUNNING
        if fam == Family.SCALAR:
            step, t, a, b, pos = _scalar(buf, n, pos, op)
        elif fam == Family.MEMO_GET:
            step, t, a, b, pos = _memo_get(buf, pos, op, mm_t, mm_a, mm_b)
        elif fam == Family.MEMO_PUT:
            step, pos, memo_n = _memo_put(buf, n, pos, op, st, sp, mm_t, mm_a, mm_b,
                                             memo_n)
        elif fam == Family.SETITEM:
            step, sp, mp, ne, nen, nfr = _setitems(buf, op, st, sp,
                                                   marks, mp, nd, ed, ne, en, nen, fr, nfr)
        elif fam == Family.APPEND:
            step, sp, mp, ne, nt = _append(op, st, sp, marks, mp, nd, ed, ne, en, fr, tr, th, nt)
        elif fam == Family.EMPTY:
            step, nn = _new_node(nd, nn, op)
            t, a = Tag.OBJ, nn - 1
        elif fam == Family.TUPLE:
            step, sp, mp, nn, ne = _tuple(op, st, sp, marks, mp, nd, nn, ed, ne)
            t, a = Tag.OBJ, nn - 1
        elif fam == Family.MARK:
            if mp + 1 >= marks.shape[0]:
                step = Status.FULL
            else:
                marks[mp] = sp
                mp += 1
        elif fam == Family.FRAMING:
            pos += 8
        elif fam == Family.STOP:
            status = Status.DONE if sp == 1 else Status.BROKEN
            break
        else:
            break  # an opcode outside the subset (GLOBAL, REDUCE, POP, ...): let the unpickler decide
        if step != Status.RUNNING:
            status = step
            break
        if t >= 0:
            st[sp, Sv.TAG], st[sp, Sv.A], st[sp, Sv.B] = t, a, b
            sp += 1
    progress[0] = n
    return status, pos, st[:sp, Sv.TAG], st[:sp, Sv.A], st[:sp, Sv.B], nd[:nn], ed[:ne], en[:nen], fr[:nfr], \
        tr[:nt]
