# mypy: disable-error-code="assignment"
"""The compiled pass of the snapshot scanner (``pickle_scan``): pickle opcodes in, flat arrays out.

``_scan`` walks the bytes once with a value stack and a memo of (tag, a, b)
triples: ints and floats are stored in ``a``, strings and bytes as (offset,
length) into the buffer, containers as node ids. Nodes that receive an
``action`` key are history entries (one row of ``en``), nodes with a
``filename`` key are frames (one row of ``fr``, classified as PyTorch's own or
not as ``torch_columns.is_torch_file`` does); any other container's items are
edges. Every read is bounds-checked against the buffer and every array has a
fixed capacity, so no input can make it read or write out of range. Status 0
is a complete snapshot, 1 an opcode or shape outside the subset (or a broken
stream), 2 a capacity too small (the caller retries with more).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Value tags on the stack and in the memo.
T_NONE, T_BOOL, T_INT, T_FLOAT, T_STR, T_BYTES, T_OBJ, T_BIGINT = range(8)
# Node kinds.
K_DICT, K_LIST, K_TUPLE, K_ENTRY, K_FRAME = 1, 2, 3, 4, 5
KEYS = (b"action", b"addr", b"size", b"stream", b"time_us", b"device_free", b"frames",
        b"filename", b"line", b"name")
ACTION_NAMES = (b"alloc", b"free_requested", b"free_completed", b"segment_alloc", b"segment_free",
                b"segment_map", b"segment_unmap", b"oom", b"free")
ACTION_CODES = np.array([0, 1, 2, 3, 4, 5, 6, 7, 2], dtype=np.int8)
# Separator-agnostic patterns of PyTorch's own files (0 stands for '/' or '\\').
TORCH_PATTERNS = (b"\0site-packages\0torch\0", b"\0dist-packages\0torch\0", b"\0pytorch\0torch\0")


def _pack(items: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
    data = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
    off = np.cumsum([0] + [len(i) for i in items]).astype(np.int64)
    return data, off


LITS, LIT_OFF = _pack(KEYS + ACTION_NAMES + TORCH_PATTERNS)
N_KEYS, N_ACTIONS = len(KEYS), len(ACTION_NAMES)
ARGLEN = np.zeros(256, dtype=np.int64)  # fixed argument bytes per opcode (the rest is checked where read)
for _op, _n in ((0x95, 8), (0x4A, 4), (0x4B, 1), (0x4D, 2), (0x8A, 1), (0x47, 8), (0x8C, 1), (0x43, 1),
                (0x58, 4), (0x42, 4), (0x8D, 8), (0x8E, 8), (0x71, 1), (0x72, 4), (0x68, 1), (0x6A, 4)):
    ARGLEN[_op] = _n


@njit(cache=True)
def _eq(buf, off, ln, lits, lo, k):  # pragma: no cover - compiled
    a = lo[k]
    if lo[k + 1] - a != ln:
        return False
    for i in range(ln):  # noqa: SIM110 - compiled loop, no generator
        if buf[off + i] != lits[a + i]:
            return False
    return True


@njit(cache=True)
def _pat_at(buf, pos, end, lits, lo, k):  # pragma: no cover - compiled
    a, b = lo[k], lo[k + 1]
    if pos + (b - a) > end:
        return False
    for i in range(b - a):
        c, p = buf[pos + i], lits[a + i]
        if p == 0:
            if c != 47 and c != 92:
                return False
        elif c != p:
            return False
    return True


@njit(cache=True)
def _is_torch(buf, off, ln, lits, lo, first_pat):  # pragma: no cover - compiled
    # Mirrors torch_columns.is_torch_file on the UTF-8 bytes of the file name.
    if ln == 0 or (ln == 2 and buf[off] == 63 and buf[off + 1] == 63):
        return True
    end = off + ln
    py = ln >= 3 and buf[end - 3] == 46 and buf[end - 2] == 112 and buf[end - 1] == 121
    pyw = ln >= 4 and buf[end - 4] == 46 and buf[end - 3] == 112 and buf[end - 2] == 121 \
        and buf[end - 1] == 119
    if not (py or pyw or buf[off] == 60):
        return True
    # ^torch[/\\]
    if ln >= 6 and buf[off] == 116 and buf[off + 1] == 111 and buf[off + 2] == 114 and buf[off + 3] == 99 \
            and buf[off + 4] == 104 and (buf[off + 5] == 47 or buf[off + 5] == 92):
        return True
    for pos in range(off, end):
        if buf[pos] == 47 or buf[pos] == 92:
            for k in range(first_pat, first_pat + 3):
                if _pat_at(buf, pos, end, lits, lo, k):
                    return True
    return False


@njit(cache=True)
def _int_at(buf, pos, n, signed):  # pragma: no cover - compiled
    v = np.int64(0)
    for i in range(n):
        v |= np.int64(buf[pos + i]) << np.int64(8 * i)
    if signed and n < 8 and n > 0 and buf[pos + n - 1] >= 128:
        v -= np.int64(1) << np.int64(8 * n)
    return v


@njit(cache=True, nogil=True)
def _scan(buf, lits, lo, codes, arglen, progress, caps):  # pragma: no cover - compiled
    # No array is ever reassigned inside the loop (a reassigned array costs reference counting on
    # every iteration); running out of any capacity returns status 2 and the caller retries bigger.
    n = buf.shape[0]
    st_t = np.zeros(caps[0], np.int8)
    st_a = np.zeros(caps[0], np.int64)
    st_b = np.zeros(caps[0], np.int64)
    marks = np.empty(caps[1], np.int64)
    # Pages never written are never resident, so generous sizes cost address space only.
    # A memo slot holds tag + 1, so 0 (calloc'd, lazily zeroed) means unset.
    mm_t = np.zeros(caps[2], np.int8)
    mm_a = np.empty(caps[2], np.int64)
    mm_b = np.empty(caps[2], np.int64)
    nd_kind = np.empty(caps[3], np.int8)
    nd_aux = np.empty(caps[3], np.int32)
    nd_first = np.empty(caps[3], np.int32)
    nd_site = np.empty(caps[3], np.int32)
    nd_nfr = np.empty(caps[3], np.int32)
    nd_nent = np.empty(caps[3], np.int32)
    nd_ned = np.empty(caps[3], np.int32)
    ed_p = np.empty(caps[4], np.int32)
    ed_kt = np.empty(caps[4], np.int8)
    ed_ka = np.empty(caps[4], np.int64)
    ed_kb = np.empty(caps[4], np.int64)
    ed_vt = np.empty(caps[4], np.int8)
    ed_va = np.empty(caps[4], np.int64)
    ed_vb = np.empty(caps[4], np.int64)
    # per entry: act, act_off, act_len, addr, size, stream, time, has_time, dfree, frames, list
    en = np.empty((caps[5], 11), np.int64)
    # per frame: file_off, file_len, line (or its offset), name_off, name_len, torch, line is big, its length
    fr = np.empty((caps[6], 8), np.int64)
    sp = mp = memo_n = nn = ne = nen = nfr = 0
    pos = 0
    if n < 2 or buf[0] != 0x80 or buf[1] < 2:
        return 1, pos, st_t, st_a, st_b, nd_kind[:0], nd_aux[:0], nd_first[:0], nd_site[:0], \
            nd_nfr[:0], nd_nent[:0], ed_p[:0], ed_kt[:0], ed_ka[:0], ed_kb[:0], ed_vt[:0], ed_va[:0], \
            ed_vb[:0], en[:0], fr[:0]
    pos = 2
    status = 1
    while pos < n:
        if (pos & 0xFFFFF) < 64:
            progress[0] = pos
            if progress[1] != 0:  # the caller was interrupted: stop, it will not read the result
                break
        op = buf[pos]
        pos += 1
        if pos + arglen[op] > n:
            break  # truncated
        if sp + 4 >= st_t.shape[0]:
            status = 2
            break
        t, a, b = -1, np.int64(0), np.int64(0)  # a value to push, if t >= 0
        if op == 0x95:  # FRAME
            pos += 8
        elif op == 0x2E:  # STOP
            status = 0 if sp == 1 else 1
            break
        elif op == 0x28:  # MARK
            if mp + 1 >= marks.shape[0]:
                status = 2
                break
            marks[mp] = sp
            mp += 1
        elif op == 0x7D or op == 0x5D or op == 0x29:  # EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
            if nn + 1 >= nd_kind.shape[0]:
                status = 2
                break
            nd_kind[nn] = K_DICT if op == 0x7D else (K_LIST if op == 0x5D else K_TUPLE)
            nd_aux[nn] = -1
            nd_first[nn] = -1
            nd_site[nn] = -1
            nd_nfr[nn] = 0
            nd_nent[nn] = 0
            nd_ned[nn] = 0
            t, a = T_OBJ, nn
            nn += 1
        elif op == 0x4E:  # NONE
            t = T_NONE
        elif op == 0x88 or op == 0x89:  # NEWTRUE, NEWFALSE
            t, a = T_BOOL, 1 if op == 0x88 else 0
        elif op == 0x4A:  # BININT
            t, a = T_INT, _int_at(buf, pos, 4, True)
            pos += 4
        elif op == 0x4B:  # BININT1
            t, a = T_INT, np.int64(buf[pos])
            pos += 1
        elif op == 0x4D:  # BININT2
            t, a = T_INT, _int_at(buf, pos, 2, False)
            pos += 2
        elif op == 0x8A:  # LONG1
            k = np.int64(buf[pos])
            if pos + 1 + k > n:
                break
            if k > 8:  # beyond int64 (SIZE_MAX in allocator settings): decoded in Python
                t, a, b = T_BIGINT, pos + 1, k
            else:
                t, a = T_INT, _int_at(buf, pos + 1, k, True)
            pos += 1 + k
        elif op == 0x47:  # BINFLOAT (big-endian)
            v = np.int64(0)
            for i in range(8):
                v = (v << np.int64(8)) | np.int64(buf[pos + i])
            t, a = T_FLOAT, v
            pos += 8
        elif op == 0x8C or op == 0x43:  # SHORT_BINUNICODE, SHORT_BINBYTES
            k = np.int64(buf[pos])
            if pos + 1 + k > n:
                break
            t, a, b = (T_STR if op == 0x8C else T_BYTES), pos + 1, k
            pos += 1 + k
        elif op == 0x58 or op == 0x42:  # BINUNICODE, BINBYTES
            k = _int_at(buf, pos, 4, False)
            if pos + 4 + k > n:
                break
            t, a, b = (T_STR if op == 0x58 else T_BYTES), pos + 4, k
            pos += 4 + k
        elif op == 0x8D or op == 0x8E:  # BINUNICODE8, BINBYTES8
            k = _int_at(buf, pos, 8, False)
            if k < 0 or pos + 8 + k > n:
                break
            t, a, b = (T_STR if op == 0x8D else T_BYTES), pos + 8, k
            pos += 8 + k
        elif op == 0x94 or op == 0x71 or op == 0x72:  # MEMOIZE, BINPUT, LONG_BINPUT
            if op == 0x94:
                idx = memo_n
            elif op == 0x71:
                idx = np.int64(buf[pos])
                pos += 1
            else:
                idx = _int_at(buf, pos, 4, False)
                pos += 4
            if sp == 0 or idx > n:
                break
            if idx >= mm_t.shape[0]:
                status = 2
                break
            if mm_t[idx] == 0:
                memo_n += 1
            mm_t[idx], mm_a[idx], mm_b[idx] = st_t[sp - 1] + 1, st_a[sp - 1], st_b[sp - 1]
        elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
            if op == 0x68:
                idx = np.int64(buf[pos])
                pos += 1
            else:
                idx = _int_at(buf, pos, 4, False)
                pos += 4
            if idx < 0 or idx >= mm_t.shape[0] or mm_t[idx] == 0:
                break
            t, a, b = mm_t[idx] - 1, mm_a[idx], mm_b[idx]
        elif op == 0x85 or op == 0x86 or op == 0x87 or op == 0x74:  # TUPLE1/2/3, TUPLE
            if op == 0x74:
                if mp == 0:
                    break
                mp -= 1
                lo_ = marks[mp]
                if lo_ > sp:
                    break
            else:
                lo_ = sp - (op - 0x84)
            if lo_ < 0:
                break
            if nn + 1 >= nd_kind.shape[0]:
                status = 2
                break
            nd_kind[nn] = K_TUPLE
            nd_aux[nn] = -1
            nd_first[nn] = -1
            nd_site[nn] = -1
            nd_nfr[nn] = 0
            nd_nent[nn] = 0
            nd_ned[nn] = sp - lo_
            if ne + (sp - lo_) >= ed_p.shape[0]:
                status = 2
                break
            for j in range(lo_, sp):
                ed_p[ne], ed_kt[ne], ed_vt[ne], ed_va[ne], ed_vb[ne] = nn, -1, st_t[j], st_a[j], st_b[j]
                ne += 1
            sp = lo_
            t, a = T_OBJ, nn
            nn += 1
        elif op == 0x61 or op == 0x65:  # APPEND, APPENDS
            if op == 0x65:
                if mp == 0:
                    break
                mp -= 1
                lo_ = marks[mp]
                if lo_ > sp:
                    break
            else:
                lo_ = sp - 1
            if lo_ < 1 or st_t[lo_ - 1] != T_OBJ or nd_kind[st_a[lo_ - 1]] != K_LIST:
                break
            lst = st_a[lo_ - 1]
            if ne + (sp - lo_) >= ed_p.shape[0]:
                status = 2
                break
            bad = False
            for j in range(lo_, sp):
                ct = st_t[j]
                ck = nd_kind[st_a[j]] if ct == T_OBJ else 0
                if ck == K_FRAME:
                    f = nd_aux[st_a[j]]
                    if nd_first[lst] < 0:
                        nd_first[lst] = f
                    if nd_site[lst] < 0 and fr[f, 5] == 0:
                        nd_site[lst] = f
                    nd_nfr[lst] += 1
                elif ck == K_ENTRY:
                    e = nd_aux[st_a[j]]
                    if en[e, 10] >= 0:
                        bad = True
                        break
                    en[e, 10] = lst
                    nd_nent[lst] += 1
                else:
                    ed_p[ne], ed_kt[ne], ed_vt[ne], ed_va[ne], ed_vb[ne] = lst, -1, ct, st_a[j], st_b[j]
                    ne += 1
                    nd_ned[lst] += 1
            if bad:
                break
            sp = lo_
        elif op == 0x73 or op == 0x75:  # SETITEM, SETITEMS
            if op == 0x75:
                if mp == 0:
                    break
                mp -= 1
                lo_ = marks[mp]
                if lo_ > sp:
                    break
            else:
                lo_ = sp - 2
            if lo_ < 1 or (sp - lo_) % 2 != 0 or st_t[lo_ - 1] != T_OBJ:
                break
            d = st_a[lo_ - 1]
            kind = nd_kind[d]
            if kind == K_DICT and nd_ned[d] == 0:
                for j in range(lo_, sp, 2):
                    if st_t[j] == T_STR and _eq(buf, st_a[j], st_b[j], lits, lo, 0):
                        kind = K_ENTRY
                        break
                    if st_t[j] == T_STR and _eq(buf, st_a[j], st_b[j], lits, lo, 7):
                        kind = K_FRAME
                if kind == K_ENTRY:
                    if nen >= en.shape[0]:
                        status = 2
                        break
                    en[nen, 0] = -2
                    en[nen, 1:] = 0
                    en[nen, 8] = -1
                    en[nen, 9] = -1
                    en[nen, 10] = -1
                    nd_aux[d] = nen
                    nen += 1
                elif kind == K_FRAME:
                    if nfr >= fr.shape[0]:
                        status = 2
                        break
                    fr[nfr, :] = 0
                    nd_aux[d] = nfr
                    nfr += 1
                nd_kind[d] = kind
            if kind == K_ENTRY:
                e = nd_aux[d]
                bad = False
                for j in range(lo_, sp, 2):
                    if st_t[j] != T_STR:
                        continue
                    ko, kl = st_a[j], st_b[j]
                    vt, va, vb = st_t[j + 1], st_a[j + 1], st_b[j + 1]
                    if _eq(buf, ko, kl, lits, lo, 0):
                        if vt != T_STR:
                            bad = True
                            break
                        en[e, 0] = -1
                        en[e, 1] = va
                        en[e, 2] = vb
                        for k in range(N_ACTIONS):
                            if _eq(buf, va, vb, lits, lo, N_KEYS + k):
                                en[e, 0] = codes[k]
                                break
                    elif _eq(buf, ko, kl, lits, lo, 6):
                        if vt == T_OBJ and nd_kind[va] == K_LIST:
                            en[e, 9] = va
                        elif vt != T_NONE:
                            bad = True
                            break
                    else:
                        col = -1
                        for k in range(1, 6):
                            if _eq(buf, ko, kl, lits, lo, k):
                                col = k
                                break
                        if col < 0:
                            continue
                        if col == 4:  # time_us: None means no clock
                            if vt == T_INT:
                                en[e, 6] = va
                                en[e, 7] = 1
                            elif vt == T_NONE:
                                en[e, 7] = 0
                            else:
                                bad = True
                                break
                        elif col == 5:
                            if vt != T_INT:
                                bad = True
                                break
                            en[e, 8] = va
                        elif vt == T_INT or vt == T_BOOL:  # noqa: SIM109
                            en[e, 2 + col] = va
                        elif vt == T_NONE:
                            en[e, 2 + col] = 0
                        else:
                            bad = True
                            break
                if bad:
                    break
            elif kind == K_FRAME:
                f = nd_aux[d]
                bad = False
                for j in range(lo_, sp, 2):
                    if st_t[j] != T_STR:
                        continue
                    ko, kl = st_a[j], st_b[j]
                    vt, va, vb = st_t[j + 1], st_a[j + 1], st_b[j + 1]
                    if _eq(buf, ko, kl, lits, lo, 7):
                        if vt != T_STR:
                            bad = True
                            break
                        fr[f, 0], fr[f, 1] = va, vb
                        fr[f, 5] = 1 if _is_torch(buf, va, vb, lits, lo, N_KEYS + N_ACTIONS) else 0
                    elif _eq(buf, ko, kl, lits, lo, 8):
                        if vt != T_INT and vt != T_BIGINT:
                            bad = True
                            break
                        fr[f, 2], fr[f, 6], fr[f, 7] = va, 1 if vt == T_BIGINT else 0, vb
                    elif _eq(buf, ko, kl, lits, lo, 9):
                        if vt != T_STR:
                            bad = True
                            break
                        fr[f, 3], fr[f, 4] = va, vb
                if bad:
                    break
                if fr[f, 1] == 0:
                    fr[f, 5] = 1
            elif kind == K_DICT:
                if ne + (sp - lo_) // 2 >= ed_p.shape[0]:
                    status = 2
                    break
                for j in range(lo_, sp, 2):
                    ed_p[ne], ed_kt[ne], ed_ka[ne], ed_kb[ne] = d, st_t[j], st_a[j], st_b[j]
                    ed_vt[ne], ed_va[ne], ed_vb[ne] = st_t[j + 1], st_a[j + 1], st_b[j + 1]
                    ne += 1
                    nd_ned[d] += 1
            else:
                break
            sp = lo_
        else:
            break  # an opcode outside the subset (GLOBAL, REDUCE, POP, ...): let the unpickler decide
        if t >= 0:
            st_t[sp], st_a[sp], st_b[sp] = t, a, b
            sp += 1
    progress[0] = n
    return status, pos, st_t[:sp], st_a[:sp], st_b[:sp], nd_kind[:nn], nd_aux[:nn], nd_first[:nn], \
        nd_site[:nn], nd_nfr[:nn], nd_nent[:nn], ed_p[:ne], ed_kt[:ne], ed_ka[:ne], ed_kb[:ne], \
        ed_vt[:ne], ed_va[:ne], ed_vb[:ne], en[:nen], fr[:nfr]
