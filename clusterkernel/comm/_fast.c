/* The common case of comm.all_reduce, in C.
 *
 * A blocking SUM allreduce of a small contiguous CPU tensor on the world group, for
 * which auto picks MPI and whose signature the group has already agreed on, is a
 * few microseconds of MPI; in Python, comm's own work around it (dtype and auto
 * look-ups, the signature check, the flight entry, the timing record) cost as much
 * again. This does the same work in C and calls MPI_Allreduce itself, with the GIL
 * released as mpi4py does. Anything else returns False and the Python path runs:
 * this file decides nothing the Python path does not decide the same way (see
 * _reductions.all_reduce, whose inlined steps it mirrors one for one, and
 * tests/comm/test_fastpath.py, which holds the two to the same results, entries
 * and records).
 *
 * No MPI header or library is needed to build it: MPI_Allreduce's address and the
 * handles come from mpi4py at run time (_fastpath.py), as integers. Open MPI's
 * handles are pointers and MPICH's are ints; the handle size says which call to
 * make.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030B0000 /* PyFrame_GetLasti */

typedef int (*allreduce_ptr)(const void *, void *, int, void *, void *, void *);
typedef int (*allreduce_int)(const void *, void *, int, int, int, int);

static struct {
    int ready;
    unsigned long long hits; /* calls done here (tests check the path was taken) */
    void *fn;
    int pointer_handles;
    intptr_t in_place, comm;
    Py_ssize_t limit;
    /* owned references, set by configure() */
    PyObject *group, *gsize, *dtypes, *check, *staging, *flight, *ours, *rec, *error;
} S;

static PyObject *n_dtype, *n_is_cpu, *n_nbytes, *n_is_contiguous, *n_data_ptr, *n_force,
    *n_auto, *n_all_reduce, *n_mpi, *n_on, *n_new, *n_sigs, *n_ring, *n_append, *n_calls,
    *n_enabled, *n_comm, *n_capacity, *n_trim;

/* time.perf_counter(): CLOCK_MONOTONIC on Linux, the only system configured (the
 * timing record's start is compared with the Python path's). */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Truthiness of obj.name; -1 on error. */
static int flag(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* algs[bisect_right(limits, nbytes)] is "mpi": 1, another algorithm: 0, error: -1. */
static int auto_picks_mpi(PyObject *rules, Py_ssize_t nbytes)
{
    PyObject *rule = PyDict_GetItemWithError(rules, n_all_reduce); /* borrowed */
    if (rule == NULL || !PyTuple_Check(rule) || PyTuple_GET_SIZE(rule) != 2)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *limits = PyTuple_GET_ITEM(rule, 0), *algs = PyTuple_GET_ITEM(rule, 1);
    if (!PyList_Check(limits) && !PyTuple_Check(limits))
        return 0;
    PyObject *seq = PySequence_Fast(limits, "limits");
    if (seq == NULL)
        return -1;
    Py_ssize_t lo = 0, hi = PySequence_Fast_GET_SIZE(seq);
    while (lo < hi) { /* bisect_right */
        Py_ssize_t mid = (lo + hi) / 2;
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, mid));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (nbytes < v)
            hi = mid;
        else
            lo = mid + 1;
    }
    Py_DECREF(seq);
    PyObject *alg = PySequence_GetItem(algs, lo);
    if (alg == NULL)
        return -1;
    int r = PyUnicode_Check(alg) && PyUnicode_Compare(alg, n_mpi) == 0;
    Py_DECREF(alg);
    return r;
}

/* all_reduce(tensor) -> bool: True when done here, False for the Python path. */
static PyObject *fast_all_reduce(PyObject *self, PyObject *t)
{
    PyObject *t0 = NULL, *dtype = NULL, *nb = NULL, *v = NULL, *sig = NULL, *entry = NULL;
    PyObject *code = NULL, *ptr_obj = NULL;
    PyFrameObject *caller = NULL;
    int r;
    if (!S.ready)
        Py_RETURN_FALSE;
    if ((t0 = PyFloat_FromDouble(now())) == NULL)
        return NULL;
    if ((dtype = PyObject_GetAttr(t, n_dtype)) == NULL) {
        PyErr_Clear(); /* not a tensor: the Python path says so */
        goto fallback;
    }
    PyObject *info = PyDict_GetItemWithError(S.dtypes, dtype); /* borrowed */
    if (info == NULL)
        goto fallback_or_error; /* halves, complex, unknown: staged in Python */
    if ((r = flag(t, n_is_cpu)) != 1)
        goto fallback_or_error;
    if ((nb = PyObject_GetAttr(t, n_nbytes)) == NULL)
        goto error;
    Py_ssize_t nbytes = PyLong_AsSsize_t(nb);
    if (nbytes == -1 && PyErr_Occurred())
        goto error;
    if (nbytes >= S.limit)
        goto fallback;
    if ((v = PyObject_GetAttr(S.group, n_auto)) == NULL)
        goto error;
    if (v == Py_None || !PyDict_Check(v))
        goto fallback; /* auto not set up yet: the Python path does it */
    if ((r = auto_picks_mpi(v, nbytes)) != 1)
        goto fallback_or_error;
    Py_CLEAR(v);
    if ((v = PyObject_CallMethodNoArgs(t, n_is_contiguous)) == NULL)
        goto error;
    if (v != Py_True)
        goto fallback;
    Py_CLEAR(v);
    if ((r = flag(S.staging, n_force)) != 0)
        goto fallback_or_error;
    if ((r = flag(S.check, n_on)) != 0)
        goto fallback_or_error; /* check mode: every call goes through begin() */
    Py_ssize_t itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(info, 1));
    if (itemsize <= 0 || nbytes % itemsize)
        goto fallback_or_error;
    Py_ssize_t count = nbytes / itemsize;
    if ((r = flag(S.check, n_new)) < 0)
        goto error;
    if (r) { /* the signature must be one the group agreed on (begin() agrees new ones) */
        PyObject *sigs = PyObject_GetAttr(S.group, n_sigs);
        if (sigs == NULL)
            goto error;
        PyObject *n = PyLong_FromSsize_t(count);
        sig = n ? PyTuple_Pack(4, dtype, n, PyTuple_GET_ITEM(info, 3), n_mpi) : NULL;
        Py_XDECREF(n);
        r = sig == NULL ? -1 : PySet_Contains(sigs, sig);
        Py_DECREF(sigs);
        if (r != 1)
            goto fallback_or_error;
    }
    if ((r = flag(S.flight, n_on)) < 0)
        goto error;
    if (r) { /* the flight entry of a direct call (a call from clusterkernel walks out: Python) */
        PyFrameObject *here = PyEval_GetFrame(); /* borrowed: the Python all_reduce */
        caller = here ? PyFrame_GetBack(here) : NULL;
        if (caller == NULL)
            goto fallback;
        code = (PyObject *)PyFrame_GetCode(caller);
        r = PySet_Contains(S.ours, ((PyCodeObject *)code)->co_filename);
        if (r != 0)
            goto fallback_or_error;
        PyObject *seq = PyObject_GetAttr(S.group, n_calls);
        if (seq == NULL)
            goto error;
        Py_ssize_t n = PyLong_AsSsize_t(seq);
        PyObject *next = n == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(n + 1);
        if (next == NULL || PyObject_SetAttr(S.group, n_calls, next) < 0) {
            Py_DECREF(seq);
            Py_XDECREF(next);
            goto error;
        }
        Py_DECREF(next);
        /* [seq, op, group, nbytes, dtype, peer, code, lasti, done]: _flight's layout */
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(caller));
        entry = lasti ? PyList_New(9) : NULL;
        if (entry == NULL) {
            Py_DECREF(seq);
            Py_XDECREF(lasti);
            goto error;
        }
        PyObject *items[9] = {seq, n_all_reduce, S.group, nb, dtype, Py_None, code, lasti, Py_False};
        for (int i = 0; i < 9; i++) /* seq and lasti: references handed over */
            PyList_SET_ITEM(entry, i, i == 0 || i == 7 ? items[i] : Py_NewRef(items[i]));
        PyObject *ring = PyObject_GetAttr(S.flight, n_ring);
        if (ring == NULL)
            goto error;
        v = PyObject_CallMethodOneArg(ring, n_append, entry);
        Py_DECREF(ring);
        if (v == NULL)
            goto error;
        Py_CLEAR(v);
    }
    if ((ptr_obj = PyObject_CallMethodNoArgs(t, n_data_ptr)) == NULL)
        goto error;
    void *buf = PyLong_AsVoidPtr(ptr_obj);
    if (buf == NULL && PyErr_Occurred())
        goto error;
    intptr_t datatype = (intptr_t)PyLong_AsVoidPtr(PyTuple_GET_ITEM(info, 0));
    intptr_t op = (intptr_t)PyLong_AsVoidPtr(PyTuple_GET_ITEM(info, 2));
    if (PyErr_Occurred())
        goto error;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (S.pointer_handles)
        rc = ((allreduce_ptr)S.fn)((void *)S.in_place, buf, (int)count, (void *)datatype,
                                   (void *)op, (void *)S.comm);
    else
        rc = ((allreduce_int)S.fn)((void *)S.in_place, buf, (int)count, (int)datatype,
                                   (int)op, (int)S.comm);
    Py_END_ALLOW_THREADS
    if (rc != 0) { /* as mpi4py: MPI.Exception(error code) */
        PyObject *exc = PyObject_CallFunction(S.error, "i", rc);
        if (exc != NULL) {
            PyErr_SetObject(S.error, exc);
            Py_DECREF(exc);
        }
        goto error;
    }
    if (entry != NULL && PyList_SetItem(entry, 8, Py_NewRef(Py_True)) < 0)
        goto error;
    if ((r = flag(S.rec, n_enabled)) < 0)
        goto error;
    if (r) { /* the timing record: _handle.note()'s tuple */
        PyObject *dur = PyFloat_FromDouble(now() - PyFloat_AS_DOUBLE(t0));
        PyObject *rec = dur ? PyTuple_Pack(7, n_all_reduce, nb, n_mpi, S.gsize, t0, dur, dur) : NULL;
        Py_XDECREF(dur);
        PyObject *store = rec ? PyObject_GetAttr(S.rec, n_comm) : NULL;
        r = store ? PyList_Append(store, rec) : -1;
        Py_XDECREF(rec);
        if (r < 0) {
            Py_XDECREF(store);
            goto error;
        }
        Py_ssize_t n = PyList_GET_SIZE(store);
        Py_DECREF(store);
        PyObject *cap = PyObject_GetAttr(S.rec, n_capacity);
        Py_ssize_t capacity = cap ? PyLong_AsSsize_t(cap) : -1;
        Py_XDECREF(cap);
        if (capacity == -1 && PyErr_Occurred())
            goto error;
        if (n > capacity) {
            if ((v = PyObject_CallMethodOneArg(S.rec, n_trim, n_comm)) == NULL)
                goto error;
            Py_CLEAR(v);
        }
    }
    Py_DECREF(t0);
    Py_DECREF(dtype);
    Py_DECREF(nb);
    Py_XDECREF(sig);
    Py_XDECREF(entry);
    Py_XDECREF(code);
    Py_XDECREF(caller);
    Py_DECREF(ptr_obj);
    S.hits++;
    Py_RETURN_TRUE;

fallback_or_error:
    if (PyErr_Occurred())
        goto error;
fallback:
    Py_XDECREF(t0);
    Py_XDECREF(dtype);
    Py_XDECREF(nb);
    Py_XDECREF(v);
    Py_XDECREF(sig);
    Py_XDECREF(code);
    Py_XDECREF(caller);
    Py_RETURN_FALSE;

error:
    Py_XDECREF(t0);
    Py_XDECREF(dtype);
    Py_XDECREF(nb);
    Py_XDECREF(v);
    Py_XDECREF(sig);
    Py_XDECREF(entry);
    Py_XDECREF(code);
    Py_XDECREF(caller);
    Py_XDECREF(ptr_obj);
    return NULL;
}

static void release(void)
{
    S.ready = 0;
    Py_CLEAR(S.group);
    Py_CLEAR(S.gsize);
    Py_CLEAR(S.dtypes);
    Py_CLEAR(S.check);
    Py_CLEAR(S.staging);
    Py_CLEAR(S.flight);
    Py_CLEAR(S.ours);
    Py_CLEAR(S.rec);
    Py_CLEAR(S.error);
}

static PyObject *fast_configure(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"allreduce", "pointer_handles", "in_place", "comm", "group",
                            "dtypes", "check", "staging", "flight", "ours", "recorder",
                            "error", "limit", NULL};
    unsigned long long fn, in_place, comm;
    int pointer_handles;
    Py_ssize_t limit;
    PyObject *group, *dtypes, *check, *staging, *flight, *ours, *rec, *error;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KpKKOO!OOOO!OOn", names, &fn, &pointer_handles,
                                     &in_place, &comm, &group, &PyDict_Type, &dtypes, &check,
                                     &staging, &flight, &PyFrozenSet_Type, &ours, &rec,
                                     &error, &limit))
        return NULL;
    /* each dtypes value: (datatype handle, itemsize, SUM's op handle, the ReduceOp) */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dtypes, &pos, &key, &value)) {
        if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 4) {
            PyErr_SetString(PyExc_ValueError, "dtypes values are (datatype, itemsize, op, ReduceOp)");
            return NULL;
        }
    }
    PyObject *gsize = PyObject_GetAttrString(group, "size");
    if (gsize == NULL)
        return NULL;
    release();
    S.fn = (void *)(uintptr_t)fn;
    S.pointer_handles = pointer_handles;
    S.in_place = (intptr_t)in_place;
    S.comm = (intptr_t)comm;
    S.limit = limit;
    S.group = Py_NewRef(group);
    S.gsize = gsize;
    S.dtypes = Py_NewRef(dtypes);
    S.check = Py_NewRef(check);
    S.staging = Py_NewRef(staging);
    S.flight = Py_NewRef(flight);
    S.ours = Py_NewRef(ours);
    S.rec = Py_NewRef(rec);
    S.error = Py_NewRef(error);
    S.ready = fn != 0;
    Py_RETURN_NONE;
}

static PyObject *fast_enable(PyObject *self, PyObject *on)
{
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    if (r && S.group == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    int was = S.ready;
    S.ready = r;
    return PyBool_FromLong(was);
}

static PyObject *fast_hits(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(S.hits);
}

static PyMethodDef methods[] = {
    {"hits", fast_hits, METH_NOARGS, "hits() -> int: calls done by the fast path so far."},
    {"all_reduce", fast_all_reduce, METH_O,
     "all_reduce(tensor) -> bool: the common case of comm.all_reduce done here (True), "
     "or nothing done (False: take the Python path)."},
    {"configure", (PyCFunction)(void (*)(void))fast_configure, METH_VARARGS | METH_KEYWORDS,
     "configure(...): MPI_Allreduce's address, handles and comm's state objects."},
    {"enable", fast_enable, METH_O, "enable(on) -> bool: turn the fast path on or off; "
                                   "returns the previous state."},
    {NULL, NULL, 0, NULL},
};

static int intern_names(void)
{
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                      \
        return -1;
    INTERN(n_dtype, "dtype");
    INTERN(n_is_cpu, "is_cpu");
    INTERN(n_nbytes, "nbytes");
    INTERN(n_is_contiguous, "is_contiguous");
    INTERN(n_data_ptr, "data_ptr");
    INTERN(n_force, "force");
    INTERN(n_auto, "_auto");
    INTERN(n_all_reduce, "all_reduce");
    INTERN(n_mpi, "mpi");
    INTERN(n_on, "on");
    INTERN(n_new, "new");
    INTERN(n_sigs, "_sigs");
    INTERN(n_ring, "ring");
    INTERN(n_append, "append");
    INTERN(n_calls, "_calls");
    INTERN(n_enabled, "enabled");
    INTERN(n_comm, "comm");
    INTERN(n_capacity, "capacity");
    INTERN(n_trim, "trim");
#undef INTERN
    return 0;
}

#else /* before Python 3.11: the module exists, the Python path does everything */

static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};
static int intern_names(void) { return 0; }

#endif

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fast", "comm.all_reduce's common case in C (see _fast.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fast(void)
{
    if (intern_names() < 0)
        return NULL;
    return PyModule_Create(&module);
}
