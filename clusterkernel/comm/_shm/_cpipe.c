/* The chunk loop of the shared-memory all-reduce pipeline (pipe.py), in C.
 *
 * pipe.all_reduce_steps cuts a tensor into chunks and moves each through the
 * segment's stage buffers: copy in, reduce this rank's share across every rank's
 * buffer into rank 0's, copy out, with progress counters in shared memory between
 * the stages. In Python each chunk costs a handful of torch calls and their
 * dispatch, as much again as the copies themselves at 64 MB (BENCHMARKS.md,
 * "Collectives", "The shared-memory pipeline's chunk loop in C"). A Run does the
 * same steps for one call: the same stage buffers, counters (IN, RED, OUT in each
 * rank's line), chunk numbers and per-element order of the reduction (rank 0's
 * value, then + rank 1's, + rank 2's, ... in order, and for AVG / divisor after),
 * so its results are the Python loop's, bit for bit, and a rank running one can
 * work with a rank running the other.
 *
 * Run.step() goes as far as it can without waiting and says whether the call is
 * done; the Python generator around it does the waiting (Segment.pause: MPI
 * progress, a dead peer noticed, the core given up) and calls step() again. It
 * never spins here. The GIL is released while it moves data. Win.Sync, the full
 * memory barrier of MPI's shared-memory model, is a sequentially consistent fence
 * here, and the counters are read and written with atomic loads and stores.
 *
 * zero_copy does the in-place all-reduce of tensors that live in shared memory
 * (alloc.zero_copy_reduce) the same way: the Python loop's steps and order of additions.
 *
 * Only float32 and float64 with SUM or AVG: every other case stays in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { IN = 0, RED = 1, OUT = 2 }; /* columns of a rank's counter line (pipe.py) */
enum { BLOCK = 1024 };             /* elements reduced across all ranks at a time */

static unsigned long long hits; /* calls finished here (tests check the path was taken) */

typedef struct {
    PyObject_HEAD
    PyObject *raw;    /* the pipe window's memory (counters first): held while running */
    PyObject *tensor; /* the tensor reduced in place: held while running */
    int64_t *ctl;     /* rank j's counters at ctl + j * line */
    char *stage;      /* [n][depth][chunk] bytes: rank j's stage buffer k */
    char *data;       /* the tensor's elements */
    Py_ssize_t line, n, rank, depth, chunk;
    Py_ssize_t count, e, m, itemsize; /* elements, per chunk, chunks, bytes each */
    int64_t base;                     /* the call's first chunk number */
    long divisor;                     /* AVG: the group's size; else 1 */
    Py_ssize_t share[2][2];           /* [full chunk, last chunk]: [start, stop) */
    Py_ssize_t pos;                   /* 3 * s + stage of the loop in pipe.py */
    char **others;                    /* the other ranks' buffers of the chunk reduced */
} Run;

static int behind(const Run *r, int col, int64_t target)
{
    for (Py_ssize_t j = 0; j < r->n; j++)
        if (__atomic_load_n(r->ctl + j * r->line + col, __ATOMIC_ACQUIRE) < target)
            return 1;
    return 0;
}

static void publish(const Run *r, int col, int64_t value)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* what Win.Sync gives the Python path */
    __atomic_store_n(r->ctl + r->rank * r->line + col, value, __ATOMIC_RELEASE);
}

static char *buffer(const Run *r, Py_ssize_t rank, int64_t g)
{
    return r->stage + (rank * r->depth + g % r->depth) * r->chunk;
}

/* acc[i] = ((acc[i] + x_1[i]) + x_2[i]) + ..., then / divisor: torch's add_ per rank
 * and div_ after, per element in the same order, a block at a time so the
 * accumulator stays in the first-level cache. */
#define REDUCE(NAME, T)                                                                 \
    static void NAME(T *restrict acc, char *const *xs, Py_ssize_t k, Py_ssize_t off,    \
                     Py_ssize_t len, long divisor)                                      \
    {                                                                                   \
        const T d = (T)divisor;                                                         \
        for (Py_ssize_t i0 = 0; i0 < len; i0 += BLOCK) {                                \
            Py_ssize_t w = len - i0 < BLOCK ? len - i0 : BLOCK;                         \
            T *restrict a = acc + i0;                                                   \
            for (Py_ssize_t j = 0; j < k; j++) {                                        \
                const T *restrict x = (const T *)xs[j] + off + i0;                      \
                for (Py_ssize_t i = 0; i < w; i++)                                      \
                    a[i] += x[i];                                                       \
            }                                                                           \
            if (divisor != 1)                                                           \
                for (Py_ssize_t i = 0; i < w; i++)                                      \
                    a[i] /= d;                                                          \
        }                                                                               \
    }
REDUCE(reduce_f32, float)
REDUCE(reduce_f64, double)

static void reduce_chunk(Run *r, int64_t g, Py_ssize_t c)
{
    const Py_ssize_t *sh = r->share[c == r->m - 1];
    Py_ssize_t a = sh[0], len = sh[1] - sh[0];
    if (len <= 0)
        return;
    for (Py_ssize_t j = 1; j < r->n; j++)
        r->others[j - 1] = buffer(r, j, g);
    if (r->itemsize == 4)
        reduce_f32((float *)buffer(r, 0, g) + a, r->others, r->n - 1, a, len, r->divisor);
    else
        reduce_f64((double *)buffer(r, 0, g) + a, r->others, r->n - 1, a, len, r->divisor);
}

static Py_ssize_t chunk_bytes(const Run *r, Py_ssize_t c)
{
    Py_ssize_t elems = c == r->m - 1 ? r->count - c * r->e : r->e;
    return elems * r->itemsize;
}

/* The loop of pipe.all_reduce_steps from r->pos on, until it must wait (0) or is
 * done (1). Position 3 s + 0: copy chunk s in; 3 s + 1: reduce chunk s - 1; 3 s + 2:
 * copy chunk s - 2 out. */
static int advance(Run *r)
{
    const Py_ssize_t end = 3 * (r->m + 2);
    for (; r->pos < end; r->pos++) {
        Py_ssize_t s = r->pos / 3;
        int stage = (int)(r->pos % 3);
        Py_ssize_t c = s - stage;
        if (c < 0 || c >= r->m)
            continue;
        int64_t g = r->base + c;
        char *piece = r->data + c * r->e * r->itemsize;
        if (stage == 0) {
            if (g >= r->depth) {
                if (behind(r, OUT, g - r->depth + 1))
                    return 0; /* every rank has copied out what this buffer held */
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
            }
            memcpy(buffer(r, r->rank, g), piece, (size_t)chunk_bytes(r, c));
            publish(r, IN, g + 1);
        } else if (stage == 1) {
            if (behind(r, IN, g + 1))
                return 0;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            reduce_chunk(r, g, c);
            publish(r, RED, g + 1);
        } else {
            if (behind(r, RED, g + 1))
                return 0;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            memcpy(piece, buffer(r, 0, g), (size_t)chunk_bytes(r, c));
            publish(r, OUT, g + 1);
        }
    }
    return 1;
}

static PyObject *Run_step(Run *r, PyObject *Py_UNUSED(ignored))
{
    int done;
    Py_BEGIN_ALLOW_THREADS
    done = advance(r);
    Py_END_ALLOW_THREADS
    if (done) {
        if (r->tensor != NULL)
            hits++;
        Py_CLEAR(r->raw); /* nothing is read or written any more */
        Py_CLEAR(r->tensor);
    }
    return PyBool_FromLong(done);
}

static int Run_init(Run *r, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"raw",   "stage", "tensor", "data",  "line",  "n",
                         "rank",  "depth", "chunk",  "count", "e",     "itemsize",
                         "base",  "divisor", "full", "last",  NULL};
    PyObject *raw, *tensor;
    unsigned long long stage, data;
    long long base;
    Py_ssize_t line, n, rank, depth, chunk, count, e, itemsize;
    Py_ssize_t fa, fb, la, lb;
    long divisor;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKOKnnnnnnnnLl(nn)(nn):Run", kw, &raw, &stage,
                                     &tensor, &data, &line, &n, &rank, &depth, &chunk, &count,
                                     &e, &itemsize, &base, &divisor, &fa, &fb, &la, &lb))
        return -1;
    if (r->others != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Run: already made");
        return -1;
    }
    if ((itemsize != 4 && itemsize != 8) || n < 1 || rank < 0 || rank >= n || depth < 1 ||
        count < 1 || e < 1 || e * itemsize > chunk || line < 3 || divisor < 1 || base < 0) {
        PyErr_SetString(PyExc_ValueError, "Run: arguments out of range");
        return -1;
    }
    Py_ssize_t m = (count + e - 1) / e;
    Py_ssize_t last = count - (m - 1) * e;
    if (fa < 0 || fa > fb || fb > e || la < 0 || la > lb || lb > last) {
        PyErr_SetString(PyExc_ValueError, "Run: a share outside its chunk");
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE) < 0)
        return -1;
    char *mem = view.buf;
    Py_ssize_t size = view.len;
    PyBuffer_Release(&view); /* raw itself is held: the memory stays */
    if (size < n * line * 8 || (char *)(uintptr_t)stage < mem ||
        (char *)(uintptr_t)stage + n * depth * chunk > mem + size) {
        PyErr_SetString(PyExc_ValueError, "Run: counters or stage buffers outside raw");
        return -1;
    }
    r->others = PyMem_Malloc((size_t)n * sizeof(char *));
    if (r->others == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->raw = Py_NewRef(raw);
    r->tensor = Py_NewRef(tensor);
    r->ctl = (int64_t *)mem;
    r->stage = (char *)(uintptr_t)stage;
    r->data = (char *)(uintptr_t)data;
    r->line = line;
    r->n = n;
    r->rank = rank;
    r->depth = depth;
    r->chunk = chunk;
    r->count = count;
    r->e = e;
    r->m = m;
    r->itemsize = itemsize;
    r->base = base;
    r->divisor = divisor;
    r->share[0][0] = fa;
    r->share[0][1] = fb;
    r->share[1][0] = la;
    r->share[1][1] = lb;
    r->pos = 0;
    return 0;
}

static void Run_dealloc(Run *r)
{
    Py_CLEAR(r->raw);
    Py_CLEAR(r->tensor);
    PyMem_Free(r->others);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef Run_methods[] = {
    {"step", (PyCFunction)Run_step, METH_NOARGS,
     "Go as far as possible without waiting; True once the call is done."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RunType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "clusterkernel.comm._shm._cpipe.Run",
    .tp_basicsize = sizeof(Run),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One all_reduce through the pipe: Run(raw, stage, tensor, data, line, n, "
              "rank, depth, chunk, count, e, itemsize, base, divisor, full, last).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Run_init,
    .tp_dealloc = (destructor)Run_dealloc,
    .tp_methods = Run_methods,
};


/* The in-place all-reduce of tensors in shared memory (alloc.zero_copy_reduce): this
 * rank's share [a, b) of every rank's tensor, summed into this rank's own tensor in the
 * Python loop's order (this rank's value, then + each other rank's in rank order, then
 * / divisor), a block at a time so the sum stays in the first-level cache while every
 * rank's value is added; then each chunk of the result, still in this core's cache, is
 * copied into every other rank's tensor. The Python loop's steps without torch's
 * dispatch per chunk, and one pass over the block for all ranks' values instead of one
 * per rank (BENCHMARKS.md, "Collectives", "The in-place all-reduce in C"). Streaming
 * stores for the copies measured slower at 2 and 4 ranks: plain memcpy. */
static void zero_copy_run(char *const *ts, char **others, Py_ssize_t n, Py_ssize_t rank,
                          Py_ssize_t itemsize, Py_ssize_t a, Py_ssize_t b, long divisor,
                          Py_ssize_t chunk)
{
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (j != rank)
            others[k++] = ts[j];
    for (Py_ssize_t c0 = a; c0 < b; c0 += chunk) {
        Py_ssize_t len = b - c0 < chunk ? b - c0 : chunk;
        char *mine = ts[rank] + c0 * itemsize;
        if (itemsize == 4)
            reduce_f32((float *)mine, others, k, c0, len, divisor);
        else
            reduce_f64((double *)mine, others, k, c0, len, divisor);
        for (Py_ssize_t j = 0; j < n; j++)
            if (j != rank)
                memcpy(ts[j] + c0 * itemsize, mine, (size_t)(len * itemsize));
    }
}

static PyObject *zero_copy(PyObject *self, PyObject *args)
{
    PyObject *ptrs;
    Py_ssize_t rank, a, b, itemsize, chunk;
    long divisor;
    if (!PyArg_ParseTuple(args, "O!nnnnln:zero_copy", &PyTuple_Type, &ptrs, &rank, &itemsize,
                          &a, &b, &divisor, &chunk))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(ptrs);
    if ((itemsize != 4 && itemsize != 8) || n < 1 || rank < 0 || rank >= n || a < 0 ||
        a > b || divisor < 1 || chunk < 1) {
        PyErr_SetString(PyExc_ValueError, "zero_copy: arguments out of range");
        return NULL;
    }
    char **ts = PyMem_Malloc((size_t)(2 * n) * sizeof(char *)); /* and the others' */
    if (ts == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < n; j++) {
        ts[j] = (char *)(uintptr_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ptrs, j));
        if (PyErr_Occurred()) {
            PyMem_Free(ts);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    zero_copy_run(ts, ts + n, n, rank, itemsize, a, b, divisor, chunk);
    Py_END_ALLOW_THREADS
    PyMem_Free(ts);
    hits++;
    Py_RETURN_NONE;
}

static PyObject *get_hits(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromUnsignedLongLong(hits);
}

static PyMethodDef methods[] = {
    {"hits", get_hits, METH_NOARGS, "How many all_reduce calls finished in C on this rank."},
    {"zero_copy", zero_copy, METH_VARARGS,
     "zero_copy(ptrs, rank, itemsize, a, b, divisor, chunk): reduce elements [a, b) "
     "of every rank's tensor (ptrs: their addresses, by rank) into this rank's, and copy "
     "the result into the others' chunk elements at a time."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpipe", "The shared-memory all-reduce's chunk loop (see _cpipe.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cpipe(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyType_Ready(&RunType) < 0 ||
                      PyModule_AddObjectRef(m, "Run", (PyObject *)&RunType) < 0))
        Py_CLEAR(m);
    return m;
}
