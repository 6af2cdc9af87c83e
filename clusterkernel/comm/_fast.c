/* The common case of comm.all_reduce, in C.
 *
 * A blocking SUM allreduce of a small contiguous CPU tensor on the world group, by
 * MPI (asked for, or auto's pick) and whose signature the group agreed on, is a
 * few microseconds of MPI; in Python, comm's own work around it (dtype and auto
 * look-ups, the signature check, the flight entry, the timing record) cost as much
 * again. Here the same work is done in C and MPI_Allreduce is called directly, with
 * the GIL released as mpi4py does. FastFunction is the public comm.all_reduce: it
 * tries try_fast() on calls of that shape and hands every other call, and every
 * call try_fast() declines, to the Python all_reduce unchanged. try_fast() decides
 * nothing the Python path does not decide the same way: it mirrors the inlined
 * steps of _reductions.all_reduce one for one, and tests/comm/mpi/case_fastpath.py
 * holds the two to the same results, flight entries and timing records.
 *
 * No MPI header or library is needed to build it: MPI_Allreduce's address and the
 * handles come from mpi4py at run time (_fastpath.py), as integers. Open MPI's
 * handles are pointers and MPICH's are ints; the handle size says which call to
 * make.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "_flightring.h"

#if PY_VERSION_HEX >= 0x030B0000 /* PyFrame_GetLasti */

typedef int (*allreduce_ptr)(const void *, void *, int, void *, void *, void *);
typedef int (*allreduce_int)(const void *, void *, int, int, int, int);

static struct {
    int ready;
    int busy; /* calls inside try_fast_here() (see try_fast) */
    unsigned long long hits; /* calls done here (tests check the path was taken) */
    void *fn;
    int pointer_handles;
    intptr_t in_place, comm;
    Py_ssize_t limit;
    /* owned references, set by configure() */
    PyObject *group, *gsize, *dtypes, *check, *staging, *flight, *ours, *rec, *error, *sum;
    /* where __slots__ attributes live in their objects (-1: look them up by name) */
    Py_ssize_t at_auto, at_sigs, at_calls, at_flight_on, at_ring;
    PyObject *user_code; /* the last caller's code found outside clusterkernel (held) */
} S;

static PyObject *n_dtype, *n_is_cpu, *n_nbytes, *n_is_contiguous, *n_data_ptr, *n_force,
    *n_auto, *n_all_reduce, *n_mpi, *n_on, *n_new, *n_sigs, *n_ring, *n_append, *n_calls,
    *n_enabled, *n_comm, *n_capacity, *n_trim, *n_op, *n_group, *n_async_op, *n_algorithm,
    *n_auto_alg;

/* time.perf_counter(): CLOCK_MONOTONIC on Linux, the only system configured (the
 * timing record's start is compared with the Python path's). */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The offset of obj's __slots__ attribute name (a writable object slot), or -1. */
static Py_ssize_t slot_offset(PyObject *obj, const char *name)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), name);
    if (descr == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            off = m->offset;
    }
    Py_DECREF(descr);
    return off;
}

/* obj.name as a new reference: read from its slot when it has one (what getattr
 * would return, without the look-up), else by name. */
static PyObject *attr(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);
}

/* obj.name = value (a new reference is taken), through its slot when it has one. */
static int set_attr(PyObject *obj, Py_ssize_t off, PyObject *name, PyObject *value)
{
    if (off < 0)
        return PyObject_SetAttr(obj, name, value);
    PyObject **slot = (PyObject **)((char *)obj + off);
    PyObject *old = *slot;
    *slot = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

/* Truthiness of obj.name (off: its slot, or -1; see attr); -1 on error. */
static int flag(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    PyObject *v = attr(obj, off, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* algs[bisect_right(limits, nbytes)] is "mpi": 1; anything else: 0. Limits that are
 * not plain ints in range, or rules of another shape, are left to the Python path
 * (bisect compares whatever they are, or raises the error there). */
static int auto_picks_mpi(PyObject *rules, Py_ssize_t nbytes)
{
    PyObject *rule = PyDict_GetItemWithError(rules, n_all_reduce); /* borrowed */
    if (rule == NULL || !PyTuple_CheckExact(rule) || PyTuple_GET_SIZE(rule) != 2) {
        PyErr_Clear();
        return 0;
    }
    Py_INCREF(rule); /* nothing below runs Python code, but the rules are not ours */
    PyObject *limits = PyTuple_GET_ITEM(rule, 0), *algs = PyTuple_GET_ITEM(rule, 1);
    int r = 0;
    if ((PyList_CheckExact(limits) || PyTuple_CheckExact(limits)) &&
        (PyList_CheckExact(algs) || PyTuple_CheckExact(algs))) {
        Py_ssize_t lo = 0, hi = PySequence_Fast_GET_SIZE(limits), ok = 1;
        while (lo < hi && ok) { /* bisect_right */
            Py_ssize_t mid = (lo + hi) / 2;
            PyObject *item = PySequence_Fast_GET_ITEM(limits, mid);
            Py_ssize_t v = PyLong_CheckExact(item) ? PyLong_AsSsize_t(item) : -1;
            if (v == -1 && (!PyLong_CheckExact(item) || PyErr_Occurred())) {
                PyErr_Clear();
                ok = 0;
            } else if (nbytes < v) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        if (ok && lo < PySequence_Fast_GET_SIZE(algs)) {
            PyObject *alg = PySequence_Fast_GET_ITEM(algs, lo);
            r = PyUnicode_Check(alg) && PyUnicode_Compare(alg, n_mpi) == 0;
        }
    }
    Py_DECREF(rule);
    return r;
}

/* The call done here: 1; left to the Python path (nothing done): 0; an error: -1. */
static int try_fast_here(PyObject *t, int given_mpi)
{
    PyObject *t0 = NULL, *dtype = NULL, *nb = NULL, *v = NULL, *sig = NULL, *entry = NULL;
    PyObject *code = NULL, *ptr_obj = NULL;
    PyFrameObject *caller; /* borrowed */
    int r;
    if ((t0 = PyFloat_FromDouble(now())) == NULL)
        return -1;
    if ((dtype = PyObject_GetAttr(t, n_dtype)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto error;
        PyErr_Clear(); /* not a tensor: the Python path says so */
        goto fallback;
    }
    PyObject *info = PyDict_GetItemWithError(S.dtypes, dtype); /* borrowed */
    if (info == NULL)
        goto fallback_or_error; /* halves, complex, unknown: staged in Python */
    if ((r = flag(t, -1, n_is_cpu)) != 1)
        goto fallback_or_error;
    if ((nb = PyObject_GetAttr(t, n_nbytes)) == NULL)
        goto error;
    Py_ssize_t nbytes = PyLong_AsSsize_t(nb);
    if (nbytes == -1 && PyErr_Occurred())
        goto error;
    if (nbytes >= S.limit)
        goto fallback;
    if (!given_mpi) { /* algorithm="auto": only where it picks MPI */
        if ((v = attr(S.group, S.at_auto, n_auto)) == NULL)
            goto error;
        if (v == Py_None || !PyDict_Check(v))
            goto fallback; /* auto not set up yet: the Python path does it */
        if (!auto_picks_mpi(v, nbytes))
            goto fallback;
        Py_CLEAR(v);
    }
    if ((v = PyObject_CallMethodNoArgs(t, n_is_contiguous)) == NULL)
        goto error;
    if (v != Py_True)
        goto fallback;
    Py_CLEAR(v);
    if ((r = flag(S.staging, -1, n_force)) != 0)
        goto fallback_or_error;
    if ((r = flag(S.check, -1, n_on)) != 0)
        goto fallback_or_error; /* check mode: every call goes through begin() */
    Py_ssize_t itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(info, 1));
    if (itemsize <= 0 || nbytes % itemsize)
        goto fallback_or_error;
    Py_ssize_t count = nbytes / itemsize;
    if ((r = flag(S.check, -1, n_new)) < 0)
        goto error;
    if (r) { /* the signature must be one the group agreed on (begin() agrees new ones) */
        PyObject *sigs = attr(S.group, S.at_sigs, n_sigs);
        if (sigs == NULL)
            goto error;
        PyObject *n = PyLong_FromSsize_t(count);
        sig = n ? PyTuple_Pack(4, dtype, n, S.sum, n_mpi) : NULL;
        Py_XDECREF(n);
        r = sig == NULL ? -1 : PySet_Contains(sigs, sig);
        Py_DECREF(sigs);
        if (r != 1)
            goto fallback_or_error;
    }
    if ((r = flag(S.flight, S.at_flight_on, n_on)) < 0)
        goto error;
    if (r) { /* the flight entry of a direct call (a call from clusterkernel walks out: Python) */
        /* No Python frame of comm's own sits between: this is the caller's, live
         * across calls from a loop (sys._getframe(1) in the Python path). */
        caller = PyEval_GetFrame();
        if (caller == NULL)
            goto fallback;
        code = (PyObject *)PyFrame_GetCode(caller);
        if (code != S.user_code) { /* a loop calls from the same code each time */
            r = PySet_Contains(S.ours, ((PyCodeObject *)code)->co_filename);
            if (r != 0)
                goto fallback_or_error;
            Py_XSETREF(S.user_code, Py_NewRef(code));
        }
        PyObject *seq = attr(S.group, S.at_calls, n_calls);
        if (seq == NULL)
            goto error;
        Py_ssize_t n = PyLong_AsSsize_t(seq);
        PyObject *next = n == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(n + 1);
        if (next == NULL || set_attr(S.group, S.at_calls, n_calls, next) < 0) {
            Py_DECREF(seq);
            Py_XDECREF(next);
            goto error;
        }
        Py_DECREF(next);
        /* [seq, op, group, nbytes, dtype, peer, code, lasti, done]: _flight's layout */
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(caller));
        PyObject *ring = lasti ? attr(S.flight, S.at_ring, n_ring) : NULL;
        if (ring == NULL) {
            Py_DECREF(seq);
            Py_XDECREF(lasti);
            goto error;
        }
        int ours = Py_IS_TYPE(ring, &CkFlightRingType);
        PyObject *reused = ours ? ck_ring_recycle((FlightRing *)ring, 9) : NULL;
        entry = reused ? Py_NewRef(reused) : PyList_New(9);
        if (entry == NULL) {
            Py_DECREF(seq);
            Py_DECREF(lasti);
            Py_DECREF(ring);
            goto error;
        }
        PyObject *items[9] = {seq, n_all_reduce, S.group, nb, dtype, Py_None, code, lasti, Py_False};
        PyObject *olds[9] = {NULL};
        for (int i = 0; i < 9; i++) { /* seq and lasti: references handed over */
            olds[i] = reused ? PyList_GET_ITEM(entry, i) : NULL;
            PyList_SET_ITEM(entry, i, i == 0 || i == 7 ? items[i] : Py_NewRef(items[i]));
        }
        for (int i = 0; i < 9; i++) /* only once the entry is whole: a release may run code */
            Py_XDECREF(olds[i]);
        if (reused == NULL) {
            if (ours) {
                ck_ring_push((FlightRing *)ring, Py_NewRef(entry));
            } else { /* a plain deque (set by hand): its append */
                v = PyObject_CallMethodOneArg(ring, n_append, entry);
                if (v == NULL) {
                    Py_DECREF(ring);
                    goto error;
                }
                Py_CLEAR(v);
            }
        }
        Py_DECREF(ring);
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
    if ((r = flag(S.rec, -1, n_enabled)) < 0)
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
    Py_DECREF(ptr_obj);
    S.hits++;
    return 1;

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
    return 0;

error:
    Py_XDECREF(t0);
    Py_XDECREF(dtype);
    Py_XDECREF(nb);
    Py_XDECREF(v);
    Py_XDECREF(sig);
    Py_XDECREF(entry);
    Py_XDECREF(code);
    Py_XDECREF(ptr_obj);
    return -1;
}

/* try_fast_here() borrows S's objects (the dtype table, the group...) across calls
 * into Python and across MPI with the GIL released: configure() waits for none of
 * them, so it refuses while any call is inside. */
static int try_fast(PyObject *t, int given_mpi)
{
    S.busy++;
    int r = try_fast_here(t, given_mpi);
    S.busy--;
    return r;
}

/* FastFunction(python_all_reduce): the public comm.all_reduce. A call in the common
 * case's shape (the tensor, then op SUM, group None, async_op False and algorithm
 * "auto" or "mpi", given or by default) tries try_fast(); anything else, and every call it
 * declines, goes to the Python function with the arguments exactly as given. Being
 * C, it adds no Python frame: the flight entry reads the caller's frame directly. */
typedef struct {
    PyObject_HEAD
    PyObject *fallback;
    PyObject *dict; /* __doc__, __wrapped__, __name__... (functools.update_wrapper) */
    PyObject *weakrefs;
    vectorcallfunc vectorcall;
} FastFunction;

/* obj is the text name (interned names compare by identity first). */
static int is_name(PyObject *obj, PyObject *name)
{
    return obj == name || (PyUnicode_Check(obj) && PyUnicode_Compare(obj, name) == 0);
}

static PyObject *fastfn_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames)
{
    FastFunction *f = (FastFunction *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (f->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "all_reduce is being torn down");
        return NULL;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (S.ready && nargs >= 1 && nargs <= 5) {
        PyObject *op = nargs > 1 ? args[1] : S.sum;
        PyObject *group = nargs > 2 ? args[2] : Py_None;
        PyObject *async_op = nargs > 3 ? args[3] : Py_False;
        PyObject *algorithm = nargs > 4 ? args[4] : n_auto_alg;
        int plain = 1;
        for (Py_ssize_t i = 0; i < nkw && plain; i++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            /* a keyword also given by position, or unknown: the Python function
             * raises the TypeError */
            if (is_name(key, n_op) && nargs < 2)
                op = value;
            else if (is_name(key, n_group) && nargs < 3)
                group = value;
            else if (is_name(key, n_async_op) && nargs < 4)
                async_op = value;
            else if (is_name(key, n_algorithm) && nargs < 5)
                algorithm = value;
            else
                plain = 0;
        }
        int given_mpi = plain && is_name(algorithm, n_mpi);
        if (plain && op == S.sum && group == Py_None && async_op == Py_False &&
            (given_mpi || is_name(algorithm, n_auto_alg))) {
            int r = try_fast(args[0], given_mpi);
            if (r == 1)
                Py_RETURN_NONE;
            if (r < 0)
                return NULL;
        }
    }
    return PyObject_Vectorcall(f->fallback, args, nargsf, kwnames);
}

static PyObject *fastfn_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "O:FastFunction", &fallback))
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "FastFunction wraps a callable");
        return NULL;
    }
    FastFunction *f = (FastFunction *)type->tp_alloc(type, 0);
    if (f == NULL)
        return NULL;
    f->fallback = Py_NewRef(fallback);
    f->vectorcall = fastfn_vectorcall;
    return (PyObject *)f;
}

static int fastfn_traverse(FastFunction *f, visitproc visit, void *arg)
{
    Py_VISIT(f->fallback);
    Py_VISIT(f->dict);
    return 0;
}

static int fastfn_clear(FastFunction *f)
{
    Py_CLEAR(f->fallback);
    Py_CLEAR(f->dict);
    return 0;
}

static void fastfn_dealloc(FastFunction *f)
{
    PyObject_GC_UnTrack(f);
    if (f->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)f);
    fastfn_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *fastfn_repr(FastFunction *f)
{
    return PyUnicode_FromFormat("<%R with a C fast path>", f->fallback);
}

/* Pickled by name, as a function is (update_wrapper gave it __module__ and
 * __qualname__; pickle checks that the name finds this very object). */
static PyObject *fastfn_reduce(PyObject *self, PyObject *unused)
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef fastfn_methods[] = {
    {"__reduce__", fastfn_reduce, METH_NOARGS, "pickled by name, like a function"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fastfn_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastFunctionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "clusterkernel.comm._fast.FastFunction",
    .tp_basicsize = sizeof(FastFunction),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FastFunction(python_all_reduce): comm.all_reduce with its common case in C.",
    .tp_new = fastfn_new,
    .tp_dealloc = (destructor)fastfn_dealloc,
    .tp_traverse = (traverseproc)fastfn_traverse,
    .tp_clear = (inquiry)fastfn_clear,
    .tp_repr = (reprfunc)fastfn_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastFunction, vectorcall),
    .tp_dictoffset = offsetof(FastFunction, dict),
    .tp_weaklistoffset = offsetof(FastFunction, weakrefs),
    .tp_getset = fastfn_getset,
    .tp_methods = fastfn_methods,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
};

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
    Py_CLEAR(S.sum);
    Py_CLEAR(S.user_code);
}

static PyObject *fast_configure(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"allreduce", "pointer_handles", "in_place", "comm", "group",
                            "dtypes", "check", "staging", "flight", "ours", "recorder",
                            "error", "limit", "sum", NULL};
    unsigned long long fn, in_place, comm;
    int pointer_handles;
    Py_ssize_t limit;
    PyObject *group, *dtypes, *check, *staging, *flight, *ours, *rec, *error, *sum;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KpKKOO!OOOO!OOnO", names, &fn, &pointer_handles,
                                     &in_place, &comm, &group, &PyDict_Type, &dtypes, &check,
                                     &staging, &flight, &PyFrozenSet_Type, &ours, &rec,
                                     &error, &limit, &sum))
        return NULL;
    /* each dtypes value: (datatype handle, itemsize, SUM's op handle) */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dtypes, &pos, &key, &value)) {
        if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 3) {
            PyErr_SetString(PyExc_ValueError, "dtypes values are (datatype, itemsize, op)");
            return NULL;
        }
    }
    if (S.busy) {
        PyErr_SetString(PyExc_RuntimeError, "configure() while an all_reduce is in the fast path");
        return NULL;
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
    S.sum = Py_NewRef(sum);
    S.at_auto = slot_offset(group, "_auto");
    S.at_sigs = slot_offset(group, "_sigs");
    S.at_calls = slot_offset(group, "_calls");
    S.at_flight_on = slot_offset(flight, "on");
    S.at_ring = slot_offset(flight, "ring");
    S.ready = fn != 0;
    Py_RETURN_NONE;
}

static PyObject *fast_enable(PyObject *self, PyObject *on)
{
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    if (r && (S.group == NULL || S.fn == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "configure() with MPI_Allreduce's address first");
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
    INTERN(n_op, "op");
    INTERN(n_group, "group");
    INTERN(n_async_op, "async_op");
    INTERN(n_algorithm, "algorithm");
    INTERN(n_auto_alg, "auto");
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
    PyObject *m = PyModule_Create(&module);
#if PY_VERSION_HEX >= 0x030B0000
    if (m != NULL && (PyType_Ready(&FastFunctionType) < 0 || PyType_Ready(&CkFlightRingType) < 0 ||
                      PyModule_AddObjectRef(m, "FastFunction", (PyObject *)&FastFunctionType) < 0 ||
                      PyModule_AddObjectRef(m, "FlightRing", (PyObject *)&CkFlightRingType) < 0))
        Py_CLEAR(m);
#endif
    return m;
}
