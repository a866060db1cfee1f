/* tracekit.record._fastpath: the recorder's per-event work in C (public CPython API only).
 *
 * See the module docstring (FASTPATH_DOC below) for what it does and why; tracekit/record/fastpath.py
 * is the pure-Python fallback with the same API and the reader of the ring (read_ring).
 *
 * Builds on CPython 3.11, 3.12 and 3.13 with the public, non-limited API (no Py_BUILD_CORE): frames are
 * walked with PyThreadState_GetFrame / PyFrame_GetBack / PyFrame_GetCode / PyFrame_GetLasti, each of
 * which returns a new (strong) reference that is released before the next step.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h> /* PyFrame_GetBack, PyFrame_GetLasti: cpython/pyframe.h, from Python.h (3.11+) */

#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B0000
#error "tracekit.record._fastpath needs CPython 3.11 or later"
#endif

/* ---- memory ordering for the ring ------------------------------------------------------------ */

#if defined(__GNUC__) || defined(__clang__)
#define TK_STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define TK_STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define TK_FENCE_RELEASE() __atomic_thread_fence(__ATOMIC_RELEASE)
#elif defined(_MSC_VER)
#include <intrin.h>
#include <windows.h>
#define TK_STORE_RELAXED(p, v) (*(volatile int64_t *)(p) = (v))
#define TK_STORE_RELEASE(p, v) (MemoryBarrier(), *(volatile int64_t *)(p) = (v))
#define TK_FENCE_RELEASE() MemoryBarrier()
#else
#error "tracekit.record._fastpath needs GCC, Clang or MSVC atomics"
#endif

/* ---- the window hash ------------------------------------------------------------------------- */

/* XXH64's primes and its single-lane step (the one XXH64 uses for an input's last words) and final
 * avalanche: every step is a bijection of the state for a fixed word, and the avalanche spreads
 * every input bit over the 64 output bits. */
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t mix_step(uint64_t h, uint64_t k)
{
    k *= P2;
    k = rotl64(k, 31);
    k *= P1;
    h ^= k;
    return rotl64(h, 27) * P1 + P4;
}

static inline uint64_t avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* The frame `skip` frames outwards from the caller's (the Python frame calling into this module),
 * as a new reference, or NULL (no exception) where the stack is shorter. */
static PyFrameObject *start_frame(Py_ssize_t skip)
{
    PyFrameObject *f = PyThreadState_GetFrame(PyThreadState_Get()); /* new reference or NULL */
    while (f != NULL && skip-- > 0) {
        PyFrameObject *back = PyFrame_GetBack(f); /* new reference or NULL */
        Py_DECREF(f);
        f = back;
    }
    return f;
}

static int parse_window_args(const char *name, PyObject *const *args, Py_ssize_t nargs,
                             Py_ssize_t *skip, Py_ssize_t *depth, PyObject **stop)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(skip, depth, stop) takes 3 positional arguments (%zd given)",
                     name, nargs);
        return -1;
    }
    *skip = PyNumber_AsSsize_t(args[0], PyExc_OverflowError);
    if (*skip == -1 && PyErr_Occurred())
        return -1;
    *depth = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (*depth == -1 && PyErr_Occurred())
        return -1;
    if (*skip < 0) {
        PyErr_SetString(PyExc_ValueError, "skip must be >= 0");
        return -1;
    }
    *stop = args[2] == Py_None ? NULL : args[2];
    return 0;
}

PyDoc_STRVAR(window_hash_doc,
"window_hash(skip, depth, stop, /) -> int\n"
"--\n\n"
"The 64-bit hash (a signed int64) of the caller's frame window: starting at the Python frame that\n"
"calls this function, ``skip`` frames outwards (skip=1 inside a hook = ``sys._getframe(1)``), then at\n"
"most ``depth`` frames, ending before the first missing ``f_back`` or before the frame that ``is``\n"
"``stop`` (None: no stop frame). The hash is over each frame's code object address and ``f_lasti``\n"
"(in that order, innermost first) and the frame count, mixed with XXH64's step and avalanche.\n"
"Equal windows give equal hashes in one process (code objects must be kept alive, as LiveStacks\n"
"does, so that an address is never reused). Distinct windows collide with probability about\n"
"2**-64 per pair: n distinct windows, about n**2 / 2**65 expected collisions. Cost: ~10 ns per frame\n"
"plus one C call, versus several microseconds for the tuple key it replaces.");

static PyObject *window_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t skip, depth;
    PyObject *stop;
    (void)module;
    if (parse_window_args("window_hash", args, nargs, &skip, &depth, &stop) < 0)
        return NULL;
    uint64_t h = P5;
    Py_ssize_t n = 0;
    PyFrameObject *f = depth > 0 ? start_frame(skip) : NULL;
    while (f != NULL && (PyObject *)f != stop) {
        PyCodeObject *code = PyFrame_GetCode(f); /* new reference, never NULL */
        int lasti = PyFrame_GetLasti(f);
        h = mix_step(h, (uint64_t)(uintptr_t)code);
        h = mix_step(h, (uint64_t)(int64_t)lasti);
        Py_DECREF(code); /* f keeps it alive for as long as we hold f */
        if (++n >= depth)
            break;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    h = avalanche(mix_step(h, (uint64_t)n));
    return PyLong_FromLongLong((long long)(int64_t)h);
}

PyDoc_STRVAR(window_frames_doc,
"window_frames(skip, depth, stop, /) -> list[frame]\n"
"--\n\n"
"The frames ``window_hash(skip, depth, stop)`` hashes, innermost first: for the slow path (a window\n"
"not seen before), which names them. The caller must not keep the list beyond the event (frames\n"
"keep the program's locals alive).");

static PyObject *window_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t skip, depth;
    PyObject *stop;
    (void)module;
    if (parse_window_args("window_frames", args, nargs, &skip, &depth, &stop) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    PyFrameObject *f = depth > 0 ? start_frame(skip) : NULL;
    Py_ssize_t n = 0;
    while (f != NULL && (PyObject *)f != stop) {
        if (PyList_Append(out, (PyObject *)f) < 0) {
            Py_DECREF(f);
            Py_DECREF(out);
            return NULL;
        }
        if (++n >= depth)
            break;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    return out;
}

/* ---- the ring -------------------------------------------------------------------------------- */

#define RING_MAGIC 0x3130474E49524B54LL /* b"TKRING01" read as a little-endian int64 */
#define RING_VERSION 1
#define RING_HEADER_INTS 8
#define RING_MAX_ROW 64

typedef struct {
    PyObject_HEAD
    Py_buffer view;      /* held from construction to close() or deallocation */
    int held;            /* view is held */
    int64_t *slots;      /* first slot: the buffer's int64 number RING_HEADER_INTS */
    Py_ssize_t row_ints; /* int64 per row */
    Py_ssize_t nslots;   /* slots in the ring */
    Py_ssize_t slot;     /* the slot the next push writes: seq % nslots, kept without a division */
    long long seq;       /* rows pushed so far */
    PyObject *list;      /* the list ``extend`` appends to as well (``attach``); NULL before */
} RingObject;

static void ring_release(RingObject *self)
{
    if (self->held) {
        self->held = 0;
        self->slots = NULL;
        PyBuffer_Release(&self->view);
    }
}

static int ring_init(RingObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "row_ints", NULL};
    PyObject *buffer;
    Py_ssize_t row_ints = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|n:Ring", kwlist, &buffer, &row_ints))
        return -1;
    if (row_ints < 1 || row_ints > RING_MAX_ROW) {
        PyErr_Format(PyExc_ValueError, "row_ints must be in 1..%d, not %zd", RING_MAX_ROW, row_ints);
        return -1;
    }
    ring_release(self); /* __init__ called twice */
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0)
        return -1;
    Py_ssize_t slot_bytes = (row_ints + 1) * (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t head_bytes = RING_HEADER_INTS * (Py_ssize_t)sizeof(int64_t);
    if (((uintptr_t)view.buf % sizeof(int64_t)) != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the ring's buffer must be 8-byte aligned");
        return -1;
    }
    if (view.len < head_bytes + slot_bytes) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "a ring of %zd-int rows needs at least %zd bytes, not %zd",
                     row_ints, head_bytes + slot_bytes, view.len);
        return -1;
    }
    int64_t *words = (int64_t *)view.buf;
    Py_ssize_t nslots = (view.len - head_bytes) / slot_bytes;
    /* A reader that sees the magic sees the rest of the header and no stale row: magic last. */
    TK_STORE_RELAXED(&words[0], (int64_t)0);
    TK_FENCE_RELEASE();
    memset(words + RING_HEADER_INTS, 0, (size_t)(nslots * slot_bytes));
    words[1] = RING_VERSION;
    words[2] = row_ints;
    words[3] = nslots;
    words[4] = RING_HEADER_INTS;
    words[5] = row_ints + 1;
    words[6] = 0;
    words[7] = 0;
    TK_STORE_RELEASE(&words[0], (int64_t)RING_MAGIC);
    self->view = view;
    self->held = 1;
    self->slots = words + RING_HEADER_INTS;
    self->row_ints = row_ints;
    self->nslots = nslots;
    self->slot = 0;
    self->seq = 0;
    return 0;
}

static void ring_dealloc(RingObject *self)
{
    ring_release(self);
    Py_CLEAR(self->list);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(ring_push_doc,
"push(*row) -> None\n"
"--\n\n"
"Write one row of exactly ``row_ints`` int64 values into slot ``seq % nslots`` and count it. The\n"
"slot's marker is cleared first and set to ``seq + 1`` last, each with a release barrier, so a\n"
"reader that sees the same marker before and after copying the row has the whole row. Values are\n"
"converted before anything is written: a bad value raises (TypeError, OverflowError) and leaves\n"
"the ring as it was.");

static PyObject *ring_push(RingObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t row[RING_MAX_ROW];
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "push on a closed Ring");
        return NULL;
    }
    if (nargs != self->row_ints) {
        PyErr_Format(PyExc_TypeError, "push takes exactly %zd ints (%zd given)", self->row_ints, nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        /* ...AndOverflow: a digit loop; PyLong_AsLongLong goes through _PyLong_AsByteArray for any
         * int above 2**30 on 3.11 (a time, an address), twice as slow. */
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(args[i], &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "a ring row's value does not fit in an int64");
            return NULL;
        }
        if (v == -1 && PyErr_Occurred())
            return NULL;
        row[i] = (int64_t)v;
    }
    int64_t *slot = self->slots + self->slot * (self->row_ints + 1);
    int64_t *mark = slot + self->row_ints;
    TK_STORE_RELAXED(mark, (int64_t)0);
    TK_FENCE_RELEASE(); /* the cleared marker is visible before any of the new row */
    memcpy(slot, row, (size_t)nargs * sizeof(int64_t));
    TK_STORE_RELEASE(mark, (int64_t)(self->seq + 1)); /* the whole row is visible before the marker */
    self->seq++;
    if (++self->slot == self->nslots)
        self->slot = 0;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ring_attach_doc,
"attach(rows) -> None\n"
"--\n\n"
"The list that ``extend`` appends to (the recorder's in-process rows, ``record.hook.EventBuffer``).");

static PyObject *ring_attach(RingObject *self, PyObject *list)
{
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "attach takes a list");
        return NULL;
    }
    Py_INCREF(list);
    Py_XSETREF(self->list, list);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ring_extend_doc,
"extend(ints) -> None\n"
"--\n\n"
"``rows.extend(ints)`` on the attached list and, in the same call (no other thread runs between:\n"
"the GIL is held throughout), one ``push`` per ``row_ints`` of them, so the ring holds the list's\n"
"rows in the list's order. ``len(ints)`` must be a multiple of ``row_ints``. After ``close()`` only\n"
"the list is extended (a forked child: its rows must not reach the parent's ring).");

static PyObject *ring_extend(RingObject *self, PyObject *seq)
{
    if (self->list == NULL) {
        PyErr_SetString(PyExc_ValueError, "extend on a Ring with no attached list");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "extend takes a sequence of ints");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    if (self->held && n % self->row_ints != 0) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "extend takes a multiple of %zd ints (%zd given)", self->row_ints, n);
        return NULL;
    }
    Py_ssize_t end = PyList_GET_SIZE(self->list);
    if (PyList_SetSlice(self->list, end, end, fast) < 0) {
        Py_DECREF(fast);
        return NULL;
    }
    if (self->held) {
        for (Py_ssize_t at = 0; at < n; at += self->row_ints) {
            PyObject *r = ring_push(self, items + at, self->row_ints);
            if (r == NULL) {
                Py_DECREF(fast);
                return NULL;
            }
            Py_DECREF(r);
        }
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ring_close_doc,
"close() -> None\n"
"--\n\n"
"Release the buffer (an mmap can be closed only once no object holds it); push raises after it.");

static PyObject *ring_close(RingObject *self, PyObject *Py_UNUSED(ignored))
{
    ring_release(self);
    Py_RETURN_NONE;
}

static PyObject *ring_get_seq(RingObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->seq);
}

static PyObject *ring_get_nslots(RingObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->nslots);
}

static PyObject *ring_get_row_ints(RingObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->row_ints);
}

static PyObject *ring_get_closed(RingObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(!self->held);
}

static PyMethodDef ring_methods[] = {
    {"push", (PyCFunction)(void (*)(void))ring_push, METH_FASTCALL, ring_push_doc},
    {"attach", (PyCFunction)ring_attach, METH_O, ring_attach_doc},
    {"extend", (PyCFunction)ring_extend, METH_O, ring_extend_doc},
    {"close", (PyCFunction)ring_close, METH_NOARGS, ring_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"seq", (getter)ring_get_seq, NULL, "rows pushed so far (the next row's seq)", NULL},
    {"nslots", (getter)ring_get_nslots, NULL, "slots in the ring: the most rows a reader can get back",
     NULL},
    {"row_ints", (getter)ring_get_row_ints, NULL, "int64 values per row", NULL},
    {"closed", (getter)ring_get_closed, NULL, "the buffer was released (close())", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(ring_doc,
"Ring(buffer, row_ints=8)\n"
"--\n\n"
"A writer of fixed-size int64 rows into a writable buffer (an mmap of a shared file), overwriting\n"
"the oldest row once the ring is full. The buffer is held (buffer protocol) until close(). The\n"
"header is written at construction and every slot cleared; the layout is the module's docstring.\n"
"Not locked: every method runs with the GIL held, so pushes from several threads are serialised.\n"
"One writer per buffer.");

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracekit.record._fastpath.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = ring_doc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_init = (initproc)ring_init,
    .tp_new = PyType_GenericNew,
};

/* ---- the module ------------------------------------------------------------------------------ */

PyDoc_STRVAR(FASTPATH_DOC,
"The recorder's per-event work in C: the frame window's key, and a ring of int64 rows in shared memory.\n"
"\n"
"window_hash(skip, depth, stop) replaces the tuple key of tracekit.record.callstacks (ids of the\n"
"window's code objects, then their f_lasti: ~60 ints built and hashed at every malloc, 5-7 us for a\n"
"30-frame stack) with one C call that walks the frames and mixes (code address, lasti) pairs\n"
"into a 64-bit hash: ~10 ns per frame. window_frames(skip, depth, stop) gives the same frames as a\n"
"list, for the slow path. tracekit.record.fastpath is the pure-Python fallback and documents the\n"
"semantics both share.\n"
"\n"
"Ring layout (every word a native-endian int64; byte offsets):\n"
"  header, 8 words at 0: [0] MAGIC (b'TKRING01' as a little-endian int64, written last),\n"
"    [1] VERSION (1), [2] row_ints, [3] nslots, [4] header words (8: slot 0 starts at byte 64),\n"
"    [5] words per slot (row_ints + 1), [6] and [7] reserved (0).\n"
"  slot i at byte 64 + i * 8 * (row_ints + 1): row_ints words of the row, then its marker:\n"
"    0 = empty or being written, seq + 1 = holds the row of that seq (seq counts from 0), and\n"
"    slot i only ever holds seqs with seq % nslots == i.\n"
"  nslots = (len(buffer) - 64) // (8 * (row_ints + 1)).\n"
"A push clears the marker, writes the row, then writes the marker, with release barriers between\n"
"(a seqlock): a reader copies the markers, the rows, then the markers again, and keeps the slots\n"
"whose two markers agree and are nonzero (tracekit.record.fastpath.read_ring).\n"
"\n"
"Thread safety: everything runs with the GIL held (no function here releases it), so no lock.");

static PyMethodDef fastpath_methods[] = {
    {"window_hash", (PyCFunction)(void (*)(void))window_hash, METH_FASTCALL, window_hash_doc},
    {"window_frames", (PyCFunction)(void (*)(void))window_frames, METH_FASTCALL, window_frames_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracekit.record._fastpath",
    .m_doc = FASTPATH_DOC,
    .m_size = -1,
    .m_methods = fastpath_methods,
};

/* PyModule_AddIntConstant takes a C long: 32 bits on Windows, too small for MAGIC. */
static int add_int(PyObject *m, const char *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    if (PyModule_AddObject(m, name, v) < 0) {
        Py_DECREF(v);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__fastpath(void)
{
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastpath_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    if (add_int(m, "MAGIC", RING_MAGIC) < 0 || add_int(m, "VERSION", RING_VERSION) < 0 ||
        add_int(m, "HEADER_INTS", RING_HEADER_INTS) < 0 || add_int(m, "MAX_ROW", RING_MAX_ROW) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
