/* tracekit.record._fastpath: the recorder's per-event work in C.
 *
 * See the module docstring (FASTPATH_DOC below) for what it does and why; tracekit/record/fastpath.py
 * is the pure-Python fallback with the same API and the reader of the ring (read_ring).
 *
 * Builds on CPython 3.11, 3.12 and 3.13. The frame windows are read from the interpreter's own frame
 * records there (``internal/pycore_frame.h`` under Py_BUILD_CORE, as profilers such as memray read
 * them): ``PyFrame_GetBack`` makes a frame object for every frame that has none yet (about 50-100 ns
 * each), and a program's loop calls fresh frames at every step, so a window of 8 fresh frames cost
 * 0.4-0.6 us a malloc that way. The frames a window holds are those PyFrame_GetBack would give (the
 * incomplete ones skipped, as it skips them); at import both walks hash the importing call's stack and
 * the records are read only where they agree. Elsewhere (another version, a pre-release, a free-threaded
 * build, no internal headers, TK_PUBLIC_FRAMES defined at build, or a disagreement at import) the
 * public API: PyThreadState_GetFrame / PyFrame_GetBack / PyFrame_GetCode / PyFrame_GetLasti, each
 * reference released before the next step. Module constant RAW_FRAMES: 1 where the records are read.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h> /* PyFrame_GetBack, PyFrame_GetLasti: cpython/pyframe.h, from Python.h (3.11+) */
#if defined(__has_include)
#if !__has_include("internal/pycore_frame.h") && !defined(TK_PUBLIC_FRAMES) /* no internal headers */
#define TK_PUBLIC_FRAMES 1
#endif
#endif
#if defined(Py_GIL_DISABLED) && !defined(TK_PUBLIC_FRAMES) /* free-threaded: other threads move frames */
#define TK_PUBLIC_FRAMES 1
#endif
/* Final releases of 3.11-3.13 only: a pre-release's frame records may be laid out otherwise. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && (PY_VERSION_HEX & 0xF0) == 0xF0 && \
    !defined(TK_PUBLIC_FRAMES)
#define TK_RAW_FRAMES 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#define TK_UNDEF_BUILD_CORE 1
#endif
#include "internal/pycore_frame.h"
#ifdef TK_UNDEF_BUILD_CORE
#undef Py_BUILD_CORE
#endif
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

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

/* The frame outwards of f as a new reference (or NULL), f released. */
static PyFrameObject *step_out(PyFrameObject *f)
{
    PyFrameObject *back = PyFrame_GetBack(f); /* new reference or NULL */
    Py_DECREF(f);
    return back;
}

/* The frame `skip` frames outwards from the caller's (the Python frame calling into this module),
 * as a new reference, or NULL (no exception) where the stack is shorter. */
static PyFrameObject *start_frame(Py_ssize_t skip)
{
    PyFrameObject *f = PyThreadState_GetFrame(PyThreadState_Get()); /* new reference or NULL */
    while (f != NULL && skip-- > 0)
        f = step_out(f);
    return f;
}

#ifdef TK_RAW_FRAMES
/* The interpreter's frame records, borrowed (the GIL is held and no Python code runs meanwhile). */
static inline _PyInterpreterFrame *raw_complete(_PyInterpreterFrame *f)
{
    while (f != NULL && _PyFrame_IsIncomplete(f)) /* PyFrame_GetBack's skip */
        f = f->previous;
    return f;
}

static inline _PyInterpreterFrame *raw_top(void)
{
    PyThreadState *ts = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030D0000
    return raw_complete(ts->current_frame);
#else
    return raw_complete(ts->cframe->current_frame);
#endif
}

static inline PyCodeObject *raw_code(_PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (PyCodeObject *)f->f_executable;
#else
    return f->f_code;
#endif
}

/* PyFrame_GetLasti's value: the offset in bytes, -1 before the first instruction. */
static inline int raw_lasti(_PyInterpreterFrame *f)
{
    int lasti = _PyInterpreterFrame_LASTI(f);
    return lasti < 0 ? -1 : lasti * (int)sizeof(_Py_CODEUNIT);
}
#endif

/* The public walk's hash of the caller's frame window (window_hash's doc): `skip` frames outwards
 * from the caller's, then at most `depth` frames, ending before the frame object `stop` (NULL: none). */
static uint64_t public_window_key(Py_ssize_t skip, Py_ssize_t depth, PyObject *stop)
{
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
        f = step_out(f);
    }
    Py_XDECREF(f);
    return avalanche(mix_step(h, (uint64_t)n));
}

#ifdef TK_RAW_FRAMES
/* The same hash from the frame records (no frame object made). */
static uint64_t raw_window_key(Py_ssize_t skip, Py_ssize_t depth, PyObject *stop)
{
    uint64_t h = P5;
    Py_ssize_t n = 0;
    /* a stop that is no frame never matches, as an identity test would not */
    _PyInterpreterFrame *end = stop != NULL && PyFrame_Check(stop) ? ((PyFrameObject *)stop)->f_frame : NULL;
    _PyInterpreterFrame *f = depth > 0 ? raw_top() : NULL;
    while (f != NULL && skip-- > 0)
        f = raw_complete(f->previous);
    while (f != NULL && f != end) {
        h = mix_step(h, (uint64_t)(uintptr_t)raw_code(f));
        h = mix_step(h, (uint64_t)(int64_t)raw_lasti(f));
        if (++n >= depth)
            break;
        f = raw_complete(f->previous);
    }
    return avalanche(mix_step(h, (uint64_t)n));
}
#endif

/* 1 where the frame records are read: built for them, and the check at import found them laid out as
 * this build expects (raw_frames_agree). CPython keeps internal layouts within a minor version in
 * practice, not by promise, so a module built on one patch release checks on the one it runs on. */
static int raw_frames = 0;

/* The hash of the caller's frame window (window_hash's doc), from the frame records where they are
 * read, else through the public API. */
static uint64_t window_key(Py_ssize_t skip, Py_ssize_t depth, PyObject *stop)
{
#ifdef TK_RAW_FRAMES
    if (raw_frames)
        return raw_window_key(skip, depth, stop);
#endif
    return public_window_key(skip, depth, stop);
}

/* Whether both walks see the same frames here (the importing call's stack): 1 agree, 0 not. */
static int raw_frames_agree(void)
{
#ifdef TK_RAW_FRAMES
    for (Py_ssize_t depth = 1; depth <= 8; depth++)
        if (raw_window_key(0, depth, NULL) != public_window_key(0, depth, NULL))
            return 0;
    return 1;
#else
    return 0;
#endif
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
"2**-64 per pair: n distinct windows, about n**2 / 2**65 expected collisions. Cost: a few ns per frame\n"
"(CPython 3.11-3.13 read the interpreter's frame records: no frame object is made) plus one C call.");

static PyObject *window_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t skip, depth;
    PyObject *stop;
    (void)module;
    if (parse_window_args("window_hash", args, nargs, &skip, &depth, &stop) < 0)
        return NULL;
    return PyLong_FromLongLong((long long)(int64_t)window_key(skip, depth, stop));
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
        f = step_out(f);
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

/* Write one converted row into the next slot (the seqlock order of the module docstring). */
static inline void ring_write(RingObject *self, const int64_t *row)
{
    int64_t *slot = self->slots + self->slot * (self->row_ints + 1);
    int64_t *mark = slot + self->row_ints;
    TK_STORE_RELAXED(mark, (int64_t)0);
    TK_FENCE_RELEASE(); /* the cleared marker is visible before any of the new row */
    memcpy(slot, row, (size_t)self->row_ints * sizeof(int64_t));
    TK_STORE_RELEASE(mark, (int64_t)(self->seq + 1)); /* the whole row is visible before the marker */
    self->seq++;
    if (++self->slot == self->nslots)
        self->slot = 0;
}

/* Convert n ints to int64 into out; -1 with an exception set where one is not an int64. */
static int ints_to_i64(PyObject *const *items, Py_ssize_t n, int64_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        /* ...AndOverflow: a digit loop; PyLong_AsLongLong goes through _PyLong_AsByteArray for any
         * int above 2**30 on 3.11 (a time, an address), twice as slow. */
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "a row's value does not fit in an int64");
            return -1;
        }
        if (v == -1 && PyErr_Occurred())
            return -1;
        out[i] = (int64_t)v;
    }
    return 0;
}

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
    if (ints_to_i64(args, nargs, row) < 0)
        return NULL;
    ring_write(self, row);
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

/* ---- the rows -------------------------------------------------------------------------------- */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tracekit.record._fastpath writes the spool's little-endian rows by memcpy: little-endian only"
#endif

typedef struct {
    PyObject_HEAD
    int64_t *data;       /* len ints, room for alloc; PyMem_Malloc'ed */
    Py_ssize_t len;      /* ints held (a multiple of row_ints) */
    Py_ssize_t alloc;    /* ints data has room for */
    Py_ssize_t row_ints; /* ints per row */
    int64_t due;         /* the clock (ns) at or after which the hook trims */
    int64_t cap;         /* ints held at or after which the hook trims */
    PyObject *ring;      /* NULL or the Ring every row also goes to (``mirror``) */
} RowsObject;

static PyTypeObject RowsType;

/* Room for n more ints; -1 with MemoryError set where there is none. */
static int rows_reserve(RowsObject *self, Py_ssize_t n)
{
    if (self->len + n <= self->alloc)
        return 0;
    Py_ssize_t want = self->alloc < 1024 ? 1024 : self->alloc;
    while (want < self->len + n) {
        if (want > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(int64_t)) {
            PyErr_NoMemory();
            return -1;
        }
        want *= 2;
    }
    int64_t *data = PyMem_Realloc(self->data, (size_t)want * sizeof(int64_t));
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->data = data;
    self->alloc = want;
    return 0;
}

/* Append k whole rows (already converted) and mirror each into the ring while it is open. */
static int rows_append(RowsObject *self, const int64_t *ints, Py_ssize_t k)
{
    Py_ssize_t n = k * self->row_ints;
    if (rows_reserve(self, n) < 0)
        return -1;
    memcpy(self->data + self->len, ints, (size_t)n * sizeof(int64_t));
    self->len += n;
    RingObject *ring = (RingObject *)self->ring;
    if (ring != NULL && ring->held && ring->row_ints == self->row_ints)
        for (Py_ssize_t r = 0; r < k; r++)
            ring_write(ring, ints + r * self->row_ints);
    return 0;
}

static int rows_init(RowsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"row_ints", NULL};
    Py_ssize_t row_ints = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:Rows", kwlist, &row_ints))
        return -1;
    if (row_ints < 1 || row_ints > RING_MAX_ROW) {
        PyErr_Format(PyExc_ValueError, "row_ints must be in 1..%d, not %zd", RING_MAX_ROW, row_ints);
        return -1;
    }
    self->row_ints = row_ints;
    self->len = 0;
    self->due = INT64_MAX;
    self->cap = INT64_MAX;
    return 0;
}

static void rows_dealloc(RowsObject *self)
{
    PyMem_Free(self->data);
    self->data = NULL;
    Py_CLEAR(self->ring);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(rows_extend_doc,
"extend(ints) -> None\n"
"--\n\n"
"Append whole rows: ``len(ints)`` must be a multiple of ``row_ints``. Every value is converted\n"
"before anything is appended (a bad one raises TypeError or OverflowError and appends nothing);\n"
"each row also goes into the mirrored ring while it is open. One call: no other thread runs\n"
"between (the GIL is held throughout), so a call's rows stay together.");

static PyObject *rows_extend(RowsObject *self, PyObject *seq)
{
    PyObject *fast = PySequence_Fast(seq, "extend takes a sequence of ints");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n % self->row_ints != 0) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "extend takes a multiple of %zd ints (%zd given)", self->row_ints, n);
        return NULL;
    }
    int64_t small[4 * RING_MAX_ROW];
    int64_t *ints = n <= 4 * RING_MAX_ROW ? small : PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (ints == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    int rc = ints_to_i64(PySequence_Fast_ITEMS(fast), n, ints);
    Py_DECREF(fast);
    if (rc == 0)
        rc = rows_append(self, ints, n / self->row_ints);
    if (ints != small)
        PyMem_Free(ints);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rows_mirror_doc,
"mirror(ring) -> None\n"
"--\n\n"
"Every row appended from now on also goes into ``ring`` (a Ring of ``row_ints``-int rows), until\n"
"the ring is closed (a forked child closes it: its rows must not reach the parent's ring). None\n"
"stops mirroring.");

static PyObject *rows_mirror(RowsObject *self, PyObject *ring)
{
    if (ring == Py_None) {
        Py_CLEAR(self->ring);
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(ring, &RingType)) {
        PyErr_SetString(PyExc_TypeError, "mirror takes a Ring or None");
        return NULL;
    }
    if (((RingObject *)ring)->row_ints != self->row_ints) {
        PyErr_Format(PyExc_ValueError, "a ring of %zd-int rows cannot mirror %zd-int rows",
                     ((RingObject *)ring)->row_ints, self->row_ints);
        return NULL;
    }
    Py_INCREF(ring);
    Py_XSETREF(self->ring, ring);
    Py_RETURN_NONE;
}

/* [lo, hi) of ints from Python ints, clamped like a slice with step 1. */
static int rows_span(RowsObject *self, PyObject *const *args, Py_ssize_t first, Py_ssize_t *lo,
                     Py_ssize_t *hi)
{
    *lo = PyNumber_AsSsize_t(args[first], PyExc_OverflowError);
    if (*lo == -1 && PyErr_Occurred())
        return -1;
    *hi = PyNumber_AsSsize_t(args[first + 1], PyExc_OverflowError);
    if (*hi == -1 && PyErr_Occurred())
        return -1;
    if (*lo < 0 || *hi < *lo || *hi > self->len) {
        PyErr_Format(PyExc_IndexError, "ints %zd..%zd are not within the %zd held", *lo, *hi, self->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(rows_copy_into_doc,
"copy_into(buffer, offset, lo, hi, /) -> int\n"
"--\n\n"
"Copy ints ``lo`` to ``hi`` (little-endian int64, as the spool's ROWS frames hold them) into the\n"
"writable ``buffer`` at byte ``offset``; returns the bytes copied.");

static PyObject *rows_copy_into(RowsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "copy_into(buffer, offset, lo, hi) takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t offset = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t lo, hi;
    if (rows_span(self, args, 2, &lo, &hi) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    Py_ssize_t nbytes = (hi - lo) * (Py_ssize_t)sizeof(int64_t);
    if (offset < 0 || offset > view.len - nbytes) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "%zd bytes at offset %zd do not fit in a buffer of %zd", nbytes, offset,
                     view.len);
        return NULL;
    }
    memcpy((char *)view.buf + offset, self->data + lo, (size_t)nbytes);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(nbytes);
}

PyDoc_STRVAR(rows_to_bytes_doc,
"to_bytes(lo, hi, /) -> bytes\n"
"--\n\n"
"Ints ``lo`` to ``hi`` as little-endian int64 bytes (``numpy.frombuffer(..., numpy.int64)``).");

static PyObject *rows_to_bytes(RowsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "to_bytes(lo, hi) takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t lo, hi;
    if (rows_span(self, args, 0, &lo, &hi) < 0)
        return NULL;
    return PyBytes_FromStringAndSize((const char *)(self->data + lo), (hi - lo) * (Py_ssize_t)sizeof(int64_t));
}

static Py_ssize_t rows_length(RowsObject *self) { return self->len; }

/* rows[i] (an int) or rows[a:b] (a list of ints; step 1), for readers and tests. */
static PyObject *rows_subscript(RowsObject *self, PyObject *key)
{
    if (PySlice_Check(key)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(key, &start, &stop, &step) < 0)
            return NULL;
        Py_ssize_t n = PySlice_AdjustIndices(self->len, &start, &stop, step);
        PyObject *out = PyList_New(n);
        if (out == NULL)
            return NULL;
        for (Py_ssize_t i = 0, at = start; i < n; i++, at += step) {
            PyObject *v = PyLong_FromLongLong((long long)self->data[at]);
            if (v == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, i, v);
        }
        return out;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i += self->len;
    if (i < 0 || i >= self->len) {
        PyErr_SetString(PyExc_IndexError, "Rows index out of range");
        return NULL;
    }
    return PyLong_FromLongLong((long long)self->data[i]);
}

/* del rows[a:b] (step 1, whole rows): the trim's and take's delete. Nothing else is assignable. */
static int rows_ass_subscript(RowsObject *self, PyObject *key, PyObject *value)
{
    if (value != NULL || !PySlice_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "Rows supports only del rows[a:b]; append with extend");
        return -1;
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0)
        return -1;
    if (step != 1) {
        PyErr_SetString(PyExc_ValueError, "del rows[a:b:step] with a step other than 1");
        return -1;
    }
    PySlice_AdjustIndices(self->len, &start, &stop, step);
    if (stop <= start)
        return 0;
    if (start % self->row_ints != 0 || stop % self->row_ints != 0) {
        PyErr_Format(PyExc_ValueError, "del rows[%zd:%zd] would cut a row of %zd ints", start, stop,
                     self->row_ints);
        return -1;
    }
    memmove(self->data + start, self->data + stop, (size_t)(self->len - stop) * sizeof(int64_t));
    self->len -= stop - start;
    if (self->len == 0 && self->alloc > (1 << 20)) { /* a burst grew it: give the memory back */
        PyMem_Free(self->data);
        self->data = NULL;
        self->alloc = 0;
    }
    return 0;
}

static PyObject *rows_get_i64(RowsObject *self, void *closure)
{
    return PyLong_FromLongLong((long long)*(int64_t *)((char *)self + (Py_ssize_t)closure));
}

static int rows_set_i64(RowsObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete a Rows limit");
        return -1;
    }
    int64_t v;
    if (ints_to_i64(&value, 1, &v) < 0)
        return -1;
    *(int64_t *)((char *)self + (Py_ssize_t)closure) = v;
    return 0;
}

static PyObject *rows_get_row_ints(RowsObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->row_ints);
}

static PyObject *rows_get_ring(RowsObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->ring != NULL ? self->ring : Py_None);
}

static PyMethodDef rows_methods[] = {
    {"extend", (PyCFunction)rows_extend, METH_O, rows_extend_doc},
    {"mirror", (PyCFunction)rows_mirror, METH_O, rows_mirror_doc},
    {"copy_into", (PyCFunction)(void (*)(void))rows_copy_into, METH_FASTCALL, rows_copy_into_doc},
    {"to_bytes", (PyCFunction)(void (*)(void))rows_to_bytes, METH_FASTCALL, rows_to_bytes_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rows_getset[] = {
    {"due", (getter)rows_get_i64, (setter)rows_set_i64,
     "the clock (ns) at or after which the hook calls the buffer's trim()", (void *)offsetof(RowsObject, due)},
    {"cap", (getter)rows_get_i64, (setter)rows_set_i64,
     "ints held at or after which the hook calls the buffer's trim()", (void *)offsetof(RowsObject, cap)},
    {"row_ints", (getter)rows_get_row_ints, NULL, "ints per row", NULL},
    {"ring", (getter)rows_get_ring, NULL, "the mirrored Ring, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMappingMethods rows_as_mapping = {
    .mp_length = (lenfunc)rows_length,
    .mp_subscript = (binaryfunc)rows_subscript,
    .mp_ass_subscript = (objobjargproc)rows_ass_subscript,
};

static PySequenceMethods rows_as_sequence = {
    .sq_length = (lenfunc)rows_length,
};

PyDoc_STRVAR(rows_doc,
"Rows(row_ints=8)\n"
"--\n\n"
"The recorder's waiting rows as int64 in C memory (no Python object per row): ``extend`` appends\n"
"whole rows, ``len`` counts ints, ``del rows[a:b]`` drops written ones, ``copy_into``/``to_bytes``\n"
"give them to the spool and to ``EventBuffer.take``; ``mirror(ring)`` sends each row to a shared\n"
"Ring too; ``due`` and ``cap`` are the limits the compiled hook checks after each row.");

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracekit.record._fastpath.Rows",
    .tp_basicsize = sizeof(RowsObject),
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = rows_doc,
    .tp_methods = rows_methods,
    .tp_getset = rows_getset,
    .tp_as_mapping = &rows_as_mapping,
    .tp_as_sequence = &rows_as_sequence,
    .tp_init = (initproc)rows_init,
    .tp_new = PyType_GenericNew,
};

/* ---- the hook's callbacks -------------------------------------------------------------------- */

/* Row layout and code packing of tracekit.record.hook (ROW, DEVICE_SHIFT, SITE_SHIFT, FREE). */
#define HOOK_ROW 8
#define HOOK_DEVICE_SHIFT 4
#define HOOK_SITE_SHIFT 32
#define HOOK_OP_FREE 1
#define HOOK_UNMEASURED (-1)
#ifdef __linux__
#define NATIVE_CLOCK 1 /* Hook(clock=None) reads CLOCK_MONOTONIC, time.perf_counter_ns's clock here */
#else
#define NATIVE_CLOCK 0
#endif

enum { K_DEVICE_ID, K_SIZE, K_MEM_SIZE, K_MEM_PTR, K_PMEM_ID, K_COUNT };
static const char *const hook_kw_text[K_COUNT] = {"device_id", "size", "mem_size", "mem_ptr", "pmem_id"};
static PyObject *hook_kw[K_COUNT];            /* the names above, interned (as Cython's literals are) */
static PyObject *str_trim, *str_ptr;
/* CuPy's keyword order of each callback: malloc_postprocess(device_id, size, mem_size, mem_ptr,
 * pmem_id), free_postprocess(device_id, mem_size, mem_ptr, pmem_id). */
static const int malloc_params[] = {K_DEVICE_ID, K_SIZE, K_MEM_SIZE, K_MEM_PTR, K_PMEM_ID};
static const int free_params[] = {K_DEVICE_ID, K_MEM_SIZE, K_MEM_PTR, K_PMEM_ID};

#define HOOK_SEEN 1024 /* a power of two */
#define HOOK_SEEN_PROBE 4 /* slots a key may sit in, from its own */

typedef struct {
    PyObject_HEAD
    PyObject *buffer;   /* record.hook.EventBuffer: trim() */
    RowsObject *rows;   /* buffer.rows: rows appended here (and to its ring), due and cap read here */
    PyObject *clock;    /* () -> ns; NULL: CLOCK_MONOTONIC, which is time.perf_counter_ns on Linux */
    PyObject *stream;   /* () -> the current stream (an object with .ptr) */
    PyObject *failed;   /* (device_id, size, mem_size, site, stack): a malloc that returned no memory */
    PyObject *device;   /* NULL or (reported device id) -> the current device (several devices) */
    PyObject *hot;      /* NULL (no call-sites) or dict: window hash -> (site bits, stack id) */
    PyObject *resolve;  /* (hash, hot's answer or None) -> (site bits, stack id): the slow path */
    PyObject *launcher; /* NULL or the frame every window stops before */
    PyObject *stream_capsule; /* NULL or CuPy's get_current_stream_ptr as a C function (kept alive) */
    intptr_t (*stream_fn)(void); /* the capsule's function: "intptr_t (void)", Cython's "except? -1" */
    Py_ssize_t depth;   /* frames per window */
    /* hot's final answers seen, by the window's hash (open addressing, HOOK_SEEN_PROBE slots from the
     * key's own; a training step's few dozen stacks would evict each other in a direct-mapped table):
     * a window hit again costs no int object and no dict lookup. A final answer is never replaced in
     * hot (LiveStacks sets each key once), so a copy stays right; answers that resolve gives are not
     * kept (a LONGER window's answer depends on the frames beyond it). Zeroed with the object. */
    struct {
        uint64_t key;
        int64_t bits, stack;
        int used;
    } seen[HOOK_SEEN];
} HookObject;

static int hook_traverse(HookObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buffer);
    Py_VISIT((PyObject *)self->rows);
    Py_VISIT(self->clock);
    Py_VISIT(self->stream);
    Py_VISIT(self->failed);
    Py_VISIT(self->device);
    Py_VISIT(self->hot);
    Py_VISIT(self->resolve);
    Py_VISIT(self->launcher);
    return 0;
}

static int hook_clear(HookObject *self)
{
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->rows);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->failed);
    Py_CLEAR(self->device);
    Py_CLEAR(self->hot);
    Py_CLEAR(self->resolve);
    Py_CLEAR(self->launcher);
    Py_CLEAR(self->stream_capsule);
    self->stream_fn = NULL;
    return 0;
}

static void hook_dealloc(HookObject *self)
{
    PyObject_GC_UnTrack(self);
    hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *none_to_null(PyObject *o)
{
    if (o == NULL || o == Py_None)
        return NULL;
    Py_INCREF(o);
    return o;
}

/* The C function of a capsule from CuPy's ``cupy.cuda.stream.__pyx_capi__['get_current_stream_ptr']``
 * (Cython names a capsule by the function's C signature); 0, or -1 with TypeError set. */
static int hook_stream_capsule(HookObject *self, PyObject *capsule)
{
    const char *name = PyCapsule_CheckExact(capsule) ? PyCapsule_GetName(capsule) : NULL;
    if (name == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "stream_ptr must be a capsule of intptr_t (void)");
        return -1;
    }
    void *fn = PyCapsule_GetPointer(capsule, name);
    if (fn == NULL)
        return -1;
    if (strncmp(name, "intptr_t (void)", 15) == 0) { /* Cython may add " except? -1" */
        self->stream_fn = (intptr_t (*)(void))fn;
    } else {
        PyErr_Format(PyExc_TypeError, "stream_ptr is a capsule of %s, not intptr_t (void)", name);
        return -1;
    }
    Py_INCREF(capsule);
    self->stream_capsule = capsule;
    return 0;
}

static int hook_init(HookObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "stream", "failed", "clock", "device", "hot", "resolve", "depth",
                             "launcher", "stream_ptr", NULL};
    PyObject *buffer, *stream, *failed, *clock = Py_None, *device = Py_None, *hot = Py_None;
    PyObject *resolve = Py_None, *launcher = Py_None, *stream_ptr = Py_None;
    Py_ssize_t depth = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|$OOOOnOO:Hook", kwlist, &buffer, &stream, &failed,
                                     &clock, &device, &hot, &resolve, &depth, &launcher, &stream_ptr))
        return -1;
    if (hot != Py_None && (!PyDict_Check(hot) || resolve == Py_None || depth < 1)) {
        PyErr_SetString(PyExc_TypeError, "hot must be a dict, with a resolve function and depth >= 1");
        return -1;
    }
#ifndef __linux__
    if (clock == Py_None) {
        PyErr_SetString(PyExc_ValueError, "clock=None (CLOCK_MONOTONIC) is Linux's perf_counter_ns only");
        return -1;
    }
#endif
    PyObject *rows = PyObject_GetAttrString(buffer, "rows");
    if (rows == NULL)
        return -1;
    if (!PyObject_TypeCheck(rows, &RowsType)) {
        Py_DECREF(rows);
        PyErr_SetString(PyExc_TypeError, "buffer.rows must be a tracekit.record._fastpath.Rows");
        return -1;
    }
    hook_clear(self);
    Py_INCREF(buffer);
    self->buffer = buffer;
    self->rows = (RowsObject *)rows;
    Py_INCREF(stream);
    self->stream = stream;
    Py_INCREF(failed);
    self->failed = failed;
    self->clock = none_to_null(clock);
    self->device = none_to_null(device);
    self->hot = none_to_null(hot);
    memset(self->seen, 0, sizeof(self->seen)); /* answers of an earlier hot (__init__ again) */
    self->resolve = none_to_null(resolve);
    self->launcher = none_to_null(launcher);
    self->depth = depth;
    if (stream_ptr != Py_None && hook_stream_capsule(self, stream_ptr) < 0)
        return -1;
    return 0;
}

/* The values of a callback's parameters `params` (positional first, then by keyword name), borrowed,
 * into out (indexed by K_*). Names not among them are ignored (a newer CuPy may pass more). */
static int hook_args(const char *fname, const int *params, int nparams, PyObject *const *args,
                     size_t nargsf, PyObject *kwnames, PyObject **out)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    for (int i = 0; i < K_COUNT; i++)
        out[i] = NULL;
    if (nargs > nparams) {
        PyErr_Format(PyExc_TypeError, "%s takes at most %d arguments (%zd given)", fname, nparams, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[params[i]] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, j);
        int found = -1;
        for (int i = 0; i < nparams && found < 0; i++)
            if (name == hook_kw[params[i]])
                found = params[i];
        for (int i = 0; i < nparams && found < 0; i++) /* a name that is not interned */
            if (PyUnicode_Check(name) && PyUnicode_Compare(name, hook_kw[params[i]]) == 0)
                found = params[i];
        if (found >= 0)
            out[found] = args[nargs + j];
    }
    for (int i = 0; i < nparams; i++) {
        if (out[params[i]] == NULL && params[i] != K_PMEM_ID) {
            PyErr_Format(PyExc_TypeError, "%s missing argument '%s'", fname, hook_kw_text[params[i]]);
            return -1;
        }
    }
    return 0;
}

static int as_i64(PyObject *o, int64_t *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "a hook value does not fit in an int64");
        return -1;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *v = (int64_t)x;
    return 0;
}

/* Nanoseconds on the hook's clock. */
static int hook_now(HookObject *self, int64_t *t)
{
    if (self->clock != NULL) {
        PyObject *o = PyObject_CallNoArgs(self->clock);
        if (o == NULL)
            return -1;
        int rc = as_i64(o, t);
        Py_DECREF(o);
        return rc;
    }
#ifdef __linux__
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *t = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
#endif
    return 0;
}

/* Append one row to the rows (and their ring) with no Python object made, then trim when due: the
 * clock at or past rows.due, or rows.cap ints held (the two comparisons of the Python hook). */
static int hook_append(HookObject *self, const int64_t *row)
{
    RowsObject *rows = self->rows;
    if (rows_append(rows, row, 1) < 0)
        return -1;
    if (row[0] >= rows->due || rows->len >= rows->cap) {
        PyObject *r = PyObject_CallMethodNoArgs(self->buffer, str_trim);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* The current stream's handle: CuPy's C function where it was given (``stream_ptr``), else
 * ``stream().ptr``. */
static int hook_stream(HookObject *self, int64_t *out)
{
    if (self->stream_fn != NULL) {
        intptr_t p = self->stream_fn();
        if (p == -1 && PyErr_Occurred())
            return -1;
        *out = (int64_t)p;
        return 0;
    }
    PyObject *s = PyObject_CallNoArgs(self->stream);
    if (s == NULL)
        return -1;
    PyObject *ptr = PyObject_GetAttr(s, str_ptr);
    Py_DECREF(s);
    if (ptr == NULL)
        return -1;
    int rc = as_i64(ptr, out);
    Py_DECREF(ptr);
    return rc;
}

/* The window's answer (site bits, stack id) as C ints: hot's where it is final, else resolve's. */
static int hook_answer(HookObject *self, int64_t *bits, int64_t *stack)
{
    *bits = 0;
    *stack = -1;
    if (self->hot == NULL)
        return 0;
    uint64_t h = window_key(0, self->depth, self->launcher);
    size_t home = (size_t)(h & (HOOK_SEEN - 1)), slot = home;
#ifndef Py_GIL_DISABLED /* the table is read and written under the GIL only */
    for (int i = 0; i < HOOK_SEEN_PROBE; i++) {
        size_t at = (home + (size_t)i) & (HOOK_SEEN - 1);
        if (!self->seen[at].used) { /* keys are never removed: none lies past a free slot */
            slot = at;
            break;
        }
        if (self->seen[at].key == h) {
            *bits = self->seen[at].bits;
            *stack = self->seen[at].stack;
            return 0;
        }
    }
#else
    (void)slot;
#endif
    PyObject *key = PyLong_FromLongLong((long long)(int64_t)h);
    if (key == NULL)
        return -1;
    PyObject *v = PyDict_GetItemWithError(self->hot, key); /* borrowed */
    if (v == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    int fresh = 0;
    /* Final answers only: (int bits, stack >= -1); LONGER (-2) and bits None go to resolve. */
    if (v == NULL || !PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(v, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(v, 1)) ||
        PyLong_AsLong(PyTuple_GET_ITEM(v, 1)) < -1) {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        v = PyObject_CallFunctionObjArgs(self->resolve, key, v == NULL ? Py_None : v, NULL);
        Py_DECREF(key);
        if (v == NULL)
            return -1;
        fresh = 1;
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
            Py_DECREF(v);
            PyErr_SetString(PyExc_TypeError, "resolve must return (site bits, stack id)");
            return -1;
        }
    } else {
        Py_DECREF(key);
    }
    int rc = as_i64(PyTuple_GET_ITEM(v, 0), bits);
    if (rc == 0)
        rc = as_i64(PyTuple_GET_ITEM(v, 1), stack);
    if (fresh)
        Py_DECREF(v);
#ifndef Py_GIL_DISABLED
    else if (rc == 0) { /* hot's own final answer: kept for the next time */
        self->seen[slot].key = h;
        self->seen[slot].bits = *bits;
        self->seen[slot].stack = *stack;
        self->seen[slot].used = 1;
    }
#endif
    return rc;
}

PyDoc_STRVAR(hook_malloc_doc,
"malloc_postprocess(*, device_id, size, mem_size, mem_ptr, pmem_id) -> None\n"
"--\n\n"
"CuPy's MemoryHook callback after a malloc, in C: the window's answer (a hash of the caller's\n"
"frames looked up in ``hot``; ``resolve`` where it has none), then one row\n"
"``(t, site bits | device << 4, mem_ptr, size, mem_size, stream, -1, stack)`` appended to\n"
"``buffer.rows`` (and its ring) and a trim when due; a malloc that returned no memory calls ``failed``.");

static PyObject *hook_malloc(HookObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *a[K_COUNT];
    if (hook_args("malloc_postprocess", malloc_params, 5, args, nargsf, kwnames, a) < 0)
        return NULL;
    int64_t bits, stack;
    if (hook_answer(self, &bits, &stack) < 0)
        return NULL;
    int64_t device, ptr, size, mem_size;
    if (self->device != NULL) {
        PyObject *d = PyObject_CallOneArg(self->device, a[K_DEVICE_ID]);
        if (d == NULL)
            return NULL;
        int rc = as_i64(d, &device);
        Py_DECREF(d);
        if (rc < 0)
            return NULL;
    } else if (as_i64(a[K_DEVICE_ID], &device) < 0) {
        return NULL;
    }
    if (as_i64(a[K_MEM_PTR], &ptr) < 0 || as_i64(a[K_SIZE], &size) < 0 || as_i64(a[K_MEM_SIZE], &mem_size) < 0)
        return NULL;
    if (ptr != 0) {
        int64_t row[HOOK_ROW];
        if (hook_now(self, &row[0]) < 0 || hook_stream(self, &row[5]) < 0)
            return NULL;
        row[1] = bits | (device << HOOK_DEVICE_SHIFT);
        row[2] = ptr;
        row[3] = size;
        row[4] = mem_size;
        row[6] = HOOK_UNMEASURED;
        row[7] = stack;
        if (hook_append(self, row) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (size == 0)
        Py_RETURN_NONE;
    PyObject *r = PyObject_CallFunction(self->failed, "LOOLL", (long long)device, a[K_SIZE], a[K_MEM_SIZE],
                                        (long long)((bits >> HOOK_SITE_SHIFT) - 1), (long long)stack);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(hook_free_doc,
"free_postprocess(*, device_id, mem_size, mem_ptr, pmem_id) -> None\n"
"--\n\n"
"CuPy's MemoryHook callback after a free, in C: one row\n"
"``(t, device << 4 | FREE, mem_ptr, mem_size, 0, stream, -1, -1)`` and a trim when due. The\n"
"device is CuPy's (a block's own), never remapped.");

static PyObject *hook_free(HookObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *a[K_COUNT];
    if (hook_args("free_postprocess", free_params, 4, args, nargsf, kwnames, a) < 0)
        return NULL;
    int64_t row[HOOK_ROW], device;
    if (as_i64(a[K_DEVICE_ID], &device) < 0 || as_i64(a[K_MEM_PTR], &row[2]) < 0 ||
        as_i64(a[K_MEM_SIZE], &row[3]) < 0)
        return NULL;
    if (hook_now(self, &row[0]) < 0 || hook_stream(self, &row[5]) < 0)
        return NULL;
    row[1] = (device << HOOK_DEVICE_SHIFT) | HOOK_OP_FREE;
    row[4] = 0;
    row[6] = HOOK_UNMEASURED;
    row[7] = -1;
    if (hook_append(self, row) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(hook_ignore_doc,
"ignore(*args, **kwargs) -> None\n"
"--\n\n"
"A callback that does nothing (the four MemoryHook callbacks the recorder does not need): one C\n"
"call with no argument parsed.");

static PyObject *hook_ignore(HookObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    (void)self;
    (void)args;
    (void)nargsf;
    (void)kwnames;
    Py_RETURN_NONE;
}

static PyMethodDef hook_methods[] = {
    {"malloc_postprocess", (PyCFunction)(void (*)(void))hook_malloc, METH_FASTCALL | METH_KEYWORDS,
     hook_malloc_doc},
    {"free_postprocess", (PyCFunction)(void (*)(void))hook_free, METH_FASTCALL | METH_KEYWORDS, hook_free_doc},
    {"ignore", (PyCFunction)(void (*)(void))hook_ignore, METH_FASTCALL | METH_KEYWORDS, hook_ignore_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(hook_doc,
"Hook(buffer, stream, failed, *, clock=None, device=None, hot=None, resolve=None, depth=0, launcher=None,\n"
"     stream_ptr=None)\n"
"--\n\n"
"The recorder's malloc and free callbacks in C (tracekit.record.hook.TraceHook uses its bound\n"
"methods as the MemoryHook's): the work of the Python callbacks in tracekit.record.hook, row for\n"
"row, without a Python frame or a Python object per event. ``buffer``: the EventBuffer (``rows``,\n"
"a Rows, whose ``due`` and ``cap`` are checked after each row, and ``trim``). ``clock`` None:\n"
"CLOCK_MONOTONIC, the clock of time.perf_counter_ns on Linux. ``stream_ptr``: None, or CuPy's\n"
"``get_current_stream_ptr`` as a capsule (``cupy.cuda.stream.__pyx_capi__``), called in C instead\n"
"of ``stream().ptr``. ``hot`` None: no call-sites (site bits 0, stack -1); else the window of\n"
"``depth`` frames from the caller outwards (stopping before ``launcher``) is hashed as window_hash\n"
"does and looked up in ``hot``; an answer that is missing or not final (stack < -1, bits None)\n"
"comes from ``resolve(hash, answer or None)``, a Python function that reads the same window with\n"
"``window_frames(1, depth, launcher)``. ``hot`` may only gain keys, each set once: the hook keeps the\n"
"final answers it read from it in a table of its own (emptied by ``__init__`` alone).");

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracekit.record._fastpath.Hook",
    .tp_basicsize = sizeof(HookObject),
    .tp_dealloc = (destructor)hook_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = hook_doc,
    .tp_traverse = (traverseproc)hook_traverse,
    .tp_clear = (inquiry)hook_clear,
    .tp_methods = hook_methods,
    .tp_init = (initproc)hook_init,
    .tp_new = PyType_GenericNew,
};

static int hook_strings(void)
{
    for (int i = 0; i < K_COUNT; i++) {
        hook_kw[i] = PyUnicode_InternFromString(hook_kw_text[i]);
        if (hook_kw[i] == NULL)
            return -1;
    }
    str_trim = PyUnicode_InternFromString("trim");
    str_ptr = PyUnicode_InternFromString("ptr");
    return (str_trim && str_ptr) ? 0 : -1;
}

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
    if (PyType_Ready(&RingType) < 0 || PyType_Ready(&RowsType) < 0 || PyType_Ready(&HookType) < 0 ||
        hook_strings() < 0)
        return NULL;
    raw_frames = raw_frames_agree();
    if (PyErr_Occurred())
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
    Py_INCREF(&RowsType);
    if (PyModule_AddObject(m, "Rows", (PyObject *)&RowsType) < 0) {
        Py_DECREF(&RowsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&HookType);
    if (PyModule_AddObject(m, "Hook", (PyObject *)&HookType) < 0) {
        Py_DECREF(&HookType);
        Py_DECREF(m);
        return NULL;
    }
    if (add_int(m, "MAGIC", RING_MAGIC) < 0 || add_int(m, "VERSION", RING_VERSION) < 0 ||
        add_int(m, "HEADER_INTS", RING_HEADER_INTS) < 0 || add_int(m, "MAX_ROW", RING_MAX_ROW) < 0 ||
        add_int(m, "NATIVE_CLOCK", NATIVE_CLOCK) < 0 || add_int(m, "RAW_FRAMES", raw_frames) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
