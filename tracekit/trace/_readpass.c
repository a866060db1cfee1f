/* The reader's one pass over a trace's events, compiled when the package is built (issue 45: a
 * process's first read must not wait for numba to load). It is ``tracekit.trace._kernels.
 * pass_until_full`` written in C, statement for statement: the malloc/free pairing over a table of
 * the live allocations and every per-event check of the reader. ``tracekit.trace.readpass`` calls
 * it where this module was built and falls back to the numba pass where it was not; a test holds
 * the two equal on random event sequences, bad ones included (tests/unit/test_readpass_c.py).
 *
 * The codes it needs (``Op``, ``IssueKind``, ``Found``, ``PassState``) are handed over once by
 * ``configure`` from the Python enums, so they are defined in one place only. The table is this
 * object's own (open addressing, linear probing, deletion by shifting back, no tombstones), grown
 * in place, so the pass never stops for it. The loop runs without the GIL: the reader runs it in
 * its pairing thread while Arrow reads the next window.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Codes from the Python enums (``configure``); -1 until configured. */
enum { OP_MALLOC, OP_FREE, OP_SEGMENT_ALLOC, OP_SEGMENT_FREE, OP_OOM, N_OP };
enum { IK_MALLOC_LIVE, IK_SEGMENT_ALLOC_LIVE, N_IK };
enum { F_SEQ_BACK, F_T_BACK, F_BIG_REQUEST, F_OVER_LIVE, F_OVER_RESERVED, F_PAST_END, N_F };
enum { S_AT, S_USED, S_UNPAIRED, S_LIVE_BYTES, S_RESERVED, S_COUNTING, N_S };
static long long op_code[N_OP], issue_code[N_IK], found_code[N_F], state_slot[N_S];
static long long max_issue, max_found, max_state; /* the largest index into counts/first, found, state */
static int configured = 0;

#define EMPTY (-1) /* tags are never negative: live_table.tag_of */
#define INITIAL_SLOTS 4096
#define ADDR_SHIFT 8
#define HASH_SHIFT 20
static const uint64_t GOLDEN = 11400714819323198485ULL; /* floor(2^64 / phi): Fibonacci hashing */

typedef struct {
    PyObject_HEAD
    uint64_t *keys;
    int32_t *tags;
    int64_t *vals;
    int64_t cap; /* a power of two */
} TableObject;

static inline int64_t home(uint64_t addr, int64_t mask)
{
    return (int64_t)((((addr >> ADDR_SHIFT) * GOLDEN) >> HASH_SHIFT) & (uint64_t)mask);
}

/* The slot of (addr, tag): where it is, or the empty slot where it goes. */
static inline int64_t slot(const TableObject *t, uint64_t addr, int32_t tag)
{
    int64_t mask = t->cap - 1, j = home(addr, mask);
    while (t->tags[j] != EMPTY && (t->keys[j] != addr || t->tags[j] != tag))
        j = (j + 1) & mask;
    return j;
}

/* Empty slot j, moving back each later slot of its probe run that may take its place. */
static void table_remove(TableObject *t, int64_t j)
{
    int64_t mask = t->cap - 1, k = j;
    for (;;) {
        k = (k + 1) & mask;
        if (t->tags[k] == EMPTY)
            break;
        int64_t h = home(t->keys[k], mask);
        if ((j <= k && (h <= j || h > k)) || (j > k && h <= j && h > k)) {
            t->keys[j] = t->keys[k];
            t->tags[j] = t->tags[k];
            t->vals[j] = t->vals[k];
            j = k;
        }
    }
    t->tags[j] = EMPTY;
}

static int table_alloc(TableObject *t, int64_t cap)
{
    uint64_t *keys = PyMem_RawCalloc((size_t)cap, sizeof(uint64_t));
    int32_t *tags = PyMem_RawMalloc((size_t)cap * sizeof(int32_t));
    int64_t *vals = PyMem_RawCalloc((size_t)cap, sizeof(int64_t));
    if (!keys || !tags || !vals) {
        PyMem_RawFree(keys);
        PyMem_RawFree(tags);
        PyMem_RawFree(vals);
        return -1;
    }
    for (int64_t j = 0; j < cap; j++)
        tags[j] = EMPTY;
    t->keys = keys;
    t->tags = tags;
    t->vals = vals;
    t->cap = cap;
    return 0;
}

/* The table rehashed into twice the slots; -1 where the memory is not there (the table unchanged). */
static int table_grow(TableObject *t)
{
    TableObject old = *t;
    if (table_alloc(t, old.cap * 2) < 0) {
        *t = old;
        return -1;
    }
    for (int64_t j = 0; j < old.cap; j++) {
        if (old.tags[j] != EMPTY) {
            int64_t k = slot(t, old.keys[j], old.tags[j]);
            t->keys[k] = old.keys[j];
            t->tags[k] = old.tags[j];
            t->vals[k] = old.vals[j];
        }
    }
    PyMem_RawFree(old.keys);
    PyMem_RawFree(old.tags);
    PyMem_RawFree(old.vals);
    return 0;
}

static int table_init(TableObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Table", kwlist))
        return -1;
    if (self->keys)
        return 0;
    if (table_alloc(self, INITIAL_SLOTS) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void table_dealloc(TableObject *self)
{
    PyMem_RawFree(self->keys);
    PyMem_RawFree(self->tags);
    PyMem_RawFree(self->vals);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The arguments of ``run``, in order: name, item size, written by the pass. */
typedef struct { const char *name; Py_ssize_t itemsize; int writable; } Arg;
enum { A_STATE, A_OP, A_SEQ, A_T_NS, A_ADDR, A_SIZE, A_ROUNDED, A_DEVICE, A_KEEP, A_MATE, A_COUNTS,
       A_FIRST, A_FOUND, N_ARRAYS };
static const Arg array_args[N_ARRAYS] = {
    {"state", 8, 1}, {"op", 1, 0}, {"seq", 8, 0}, {"t_ns", 8, 0}, {"addr", 8, 0}, {"size", 8, 0},
    {"rounded", 8, 1}, {"device", 2, 0}, {"keep", 1, 1}, {"mate", 8, 1}, {"counts", 8, 1},
    {"first", 8, 1}, {"found", 8, 1},
};

static void release_all(Py_buffer *views, int n)
{
    for (int i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
}

#define FOUND(slot_, i_) do { int64_t *f_ = &found[found_code[slot_]]; if (*f_ < 0) *f_ = (i_); } while (0)

/* run(state, op, seq, t_ns, addr, size, rounded, device, keep, mate, counts, first, found,
 *     max_request, limit, checks, end): the events from state[AT] to ``end`` (see the module). With
 * ``checks`` false, t_ns, size, rounded and found are not read (empty arrays will do). Returns None;
 * MemoryError where the table could not grow (``state`` holds how far the pass got). */
static PyObject *table_run(TableObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_readpass.configure() was not called");
        return NULL;
    }
    if (!self->keys) {
        PyErr_SetString(PyExc_RuntimeError, "run(): the Table was not initialized");
        return NULL;
    }
    if (nargs != N_ARRAYS + 4) {
        PyErr_Format(PyExc_TypeError, "run() takes %d arguments (%zd given)", N_ARRAYS + 4, nargs);
        return NULL;
    }
    Py_buffer v[N_ARRAYS];
    int got = 0;
    for (; got < N_ARRAYS; got++) {
        const Arg *a = &array_args[got];
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (a->writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[got], &v[got], flags) < 0)
            goto fail;
        if (v[got].itemsize != a->itemsize || v[got].ndim > 1) {
            PyErr_Format(PyExc_TypeError, "run(): %s must be a flat array of %zd-byte items", a->name,
                         a->itemsize);
            got++;
            goto fail;
        }
    }
    uint64_t max_request = PyLong_AsUnsignedLongLong(args[N_ARRAYS]);
    long long limit_ll = PyLong_AsLongLong(args[N_ARRAYS + 1]);
    int checks = PyObject_IsTrue(args[N_ARRAYS + 2]);
    long long end_ll = PyLong_AsLongLong(args[N_ARRAYS + 3]);
    if (PyErr_Occurred() || checks < 0)
        goto fail;
    Py_ssize_t n = v[A_OP].len;
    int64_t *state = v[A_STATE].buf;
    if (v[A_STATE].len / 8 < max_state + 1 || v[A_COUNTS].len / 8 < max_issue + 1
        || v[A_FIRST].len / 8 < max_issue + 1 || end_ll < 0 || end_ll > n || v[A_SEQ].len / 8 < n
        || v[A_ADDR].len / 8 < n || v[A_DEVICE].len / 2 < n || v[A_KEEP].len < n || v[A_MATE].len / 8 < n
        || (checks && (v[A_T_NS].len / 8 < n || v[A_SIZE].len / 8 < n || v[A_ROUNDED].len / 8 < n
                       || v[A_FOUND].len / 8 < max_found + 1))
        || state[state_slot[S_AT]] < 0 || state[state_slot[S_AT]] > n) {
        PyErr_SetString(PyExc_ValueError, "run(): the arrays are shorter than the events passed");
        goto fail;
    }
    const int8_t *op = v[A_OP].buf;
    const uint64_t *seq = v[A_SEQ].buf, *addr = v[A_ADDR].buf, *size = v[A_SIZE].buf;
    const int64_t *t_ns = v[A_T_NS].buf;
    uint64_t *rounded = v[A_ROUNDED].buf;
    const int16_t *device = v[A_DEVICE].buf;
    uint8_t *keep = v[A_KEEP].buf;
    int64_t *mate = v[A_MATE].buf, *counts = v[A_COUNTS].buf, *first = v[A_FIRST].buf, *found = v[A_FOUND].buf;
    const int8_t MALLOC = (int8_t)op_code[OP_MALLOC], FREE = (int8_t)op_code[OP_FREE],
                 SEG_ALLOC = (int8_t)op_code[OP_SEGMENT_ALLOC], SEG_FREE = (int8_t)op_code[OP_SEGMENT_FREE],
                 OOM = (int8_t)op_code[OP_OOM];
    int64_t used = state[state_slot[S_USED]], unpaired = state[state_slot[S_UNPAIRED]];
    uint64_t live_bytes = (uint64_t)state[state_slot[S_LIVE_BYTES]]; /* int64 in two's complement */
    uint64_t reserved = (uint64_t)state[state_slot[S_RESERVED]];
    int counting = state[state_slot[S_COUNTING]] != 0;
    const int64_t limit = (int64_t)limit_ll, end = (int64_t)end_ll;
    const uint64_t top = UINT64_MAX;
    int64_t i = state[state_slot[S_AT]];
    int out_of_memory = 0;

    Py_BEGIN_ALLOW_THREADS
    while (i < end) {
        int64_t at = i++;
        keep[at] = 1;
        mate[at] = -1;
        int8_t o = op[at];
        if (checks) {
            if (at > 0 && seq[at] <= seq[at - 1])
                FOUND(F_SEQ_BACK, at);
            if (at > 0 && t_ns[at] < t_ns[at - 1])
                FOUND(F_T_BACK, at);
            if (o == MALLOC || o == OOM) {
                if (size[at] >= max_request)
                    FOUND(F_BIG_REQUEST, at);
                if (rounded[at] == 0)
                    rounded[at] = size[at];
            }
        }
        if (o == OOM)
            continue;
        int seg = o == SEG_ALLOC || o == SEG_FREE;
        int32_t tag = ((int32_t)device[at] & 0xFFFF) * 2 + (seg ? 1 : 0); /* live_table.tag_of */
        int64_t j = slot(self, addr[at], tag);
        int live = self->tags[j] != EMPTY;
        if (o == MALLOC || o == SEG_ALLOC) {
            if (live) {
                int64_t kind = seg ? issue_code[IK_SEGMENT_ALLOC_LIVE] : issue_code[IK_MALLOC_LIVE];
                keep[at] = 0;
                counts[kind] += 1;
                if (first[kind] < 0)
                    first[kind] = at;
                continue;
            }
            self->keys[j] = addr[at];
            self->tags[j] = tag;
            self->vals[j] = at;
            used += 1;
            if (used * 2 > self->cap && table_grow(self) < 0) {
                /* undo this event, so that ``state`` says the pass stopped before it */
                self->tags[j] = EMPTY;
                used -= 1;
                i = at;
                out_of_memory = 1;
                break;
            }
        }
        else if (live) { /* free / segment_free of a live allocation */
            int64_t m = self->vals[j];
            mate[at] = m;
            mate[m] = at;
            table_remove(self, j);
            used -= 1;
        }
        else {
            keep[at] = 0; /* counted by kind once every allocation before it is known */
            unpaired += 1;
            continue;
        }
        if (!checks)
            continue;
        uint64_t length = 0; /* of the kept event at: the totals and its range */
        if (o == MALLOC) {
            length = rounded[at];
            live_bytes += length;
        }
        else if (o == SEG_ALLOC) {
            length = size[at];
            reserved += length;
        }
        else if (o == FREE)
            live_bytes -= rounded[mate[at]];
        else
            reserved -= size[mate[at]];
        if (counting && ((int64_t)live_bytes >= limit || (int64_t)reserved >= limit)) {
            if ((int64_t)live_bytes >= limit)
                FOUND(F_OVER_LIVE, at);
            else
                FOUND(F_OVER_RESERVED, at);
            counting = 0;
        }
        if (length > 0 && length - 1 > top - addr[at])
            FOUND(F_PAST_END, at);
    }
    Py_END_ALLOW_THREADS

    state[state_slot[S_AT]] = i;
    state[state_slot[S_USED]] = used;
    state[state_slot[S_UNPAIRED]] = unpaired;
    state[state_slot[S_LIVE_BYTES]] = (int64_t)live_bytes;
    state[state_slot[S_RESERVED]] = (int64_t)reserved;
    state[state_slot[S_COUNTING]] = counting ? 1 : 0;
    release_all(v, N_ARRAYS);
    if (out_of_memory)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
fail:
    release_all(v, got);
    return NULL;
}

static PyObject *table_slots(TableObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->cap);
}

static PyMethodDef table_methods[] = {
    {"run", (PyCFunction)(void (*)(void))table_run, METH_FASTCALL,
     "run(state, op, seq, t_ns, addr, size, rounded, device, keep, mate, counts, first, found, "
     "max_request, limit, checks, end): the pass over the events from state[AT] to end."},
    {NULL},
};

static PyGetSetDef table_getset[] = {
    {"slots", (getter)table_slots, NULL, "the table's slots now (a power of two)", NULL},
    {NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracekit.trace._readpass.Table",
    .tp_doc = "The reader's pass with its table of live allocations (see the module).",
    .tp_basicsize = sizeof(TableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)table_init,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
    .tp_getset = table_getset,
};

static int codes_from(PyObject *seq, long long *out, Py_ssize_t n, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "configure(): %s needs %zd codes", what, n);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        out[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, k));
        if (out[k] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* configure(ops, issues, found, state): the codes of Op (MALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE,
 * OOM), IssueKind (MALLOC_LIVE, SEGMENT_ALLOC_LIVE), Found (SEQ_BACK, T_BACK, BIG_REQUEST, OVER_LIVE,
 * OVER_RESERVED, PAST_END) and PassState (AT, USED, UNPAIRED, LIVE_BYTES, RESERVED, COUNTING). */
static PyObject *configure(PyObject *module, PyObject *args)
{
    PyObject *ops, *issues, *found, *state;
    if (!PyArg_ParseTuple(args, "OOOO:configure", &ops, &issues, &found, &state))
        return NULL;
    if (codes_from(ops, op_code, N_OP, "ops") < 0 || codes_from(issues, issue_code, N_IK, "issues") < 0
        || codes_from(found, found_code, N_F, "found") < 0 || codes_from(state, state_slot, N_S, "state") < 0)
        return NULL;
    long long *const tables[] = {issue_code, found_code, state_slot};
    const int sizes[] = {N_IK, N_F, N_S};
    long long *const maxima[] = {&max_issue, &max_found, &max_state};
    for (int t = 0; t < 3; t++) {
        *maxima[t] = 0;
        for (int k = 0; k < sizes[t]; k++) {
            if (tables[t][k] < 0 || tables[t][k] > 1024) {
                PyErr_SetString(PyExc_ValueError, "configure(): an index out of range");
                return NULL;
            }
            if (tables[t][k] > *maxima[t])
                *maxima[t] = tables[t][k];
        }
    }
    for (int k = 0; k < N_OP; k++) {
        if (op_code[k] < -128 || op_code[k] > 127) {
            PyErr_SetString(PyExc_ValueError, "configure(): an op code is not an int8");
            return NULL;
        }
    }
    configured = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "Hand over the codes of the Python enums (see the module)."},
    {NULL},
};

static struct PyModuleDef readpass_module = {
    PyModuleDef_HEAD_INIT, "tracekit.trace._readpass",
    "The reader's pass compiled ahead of time (tracekit.trace.readpass).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__readpass(void)
{
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&readpass_module);
    if (!m)
        return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
