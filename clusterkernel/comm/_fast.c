/* The common case of comm.all_reduce, in C.
 *
 * A blocking allreduce of a contiguous CPU tensor whose plan (_plan.py, made by
 * _reductions.all_reduce on the signature's first call) says "MPI's own allreduce
 * on the tensor's memory, nothing after", on a signature the group has agreed on,
 * is a few microseconds of MPI; comm's own work around it (the plan look-up, the
 * flight entry, the timing record) costs as much again in Python. Here that work is
 * done in C and MPI_Allreduce is called directly, with the GIL released as mpi4py
 * does. FastFunction is the public comm.all_reduce: it tries try_fast() on blocking
 * calls and hands every other call, and every call try_fast() declines, to the
 * Python all_reduce unchanged. try_fast() holds no rules of its own: it looks the
 * call's key up in the group's plans and runs what the plan says, with the plan's
 * handles; the flight entry and timing record follow the ledger's layouts
 * (_ledger.py), handed over by configure(). tests/comm/mpi/case_fastpath.py holds the
 * two paths to the same results, flight entries and timing records.
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

#if PY_VERSION_HEX >= 0x030B0000 /* PyFrame_GetLasti */

typedef int (*allreduce_ptr)(const void *, void *, int, void *, void *, void *);
typedef int (*allreduce_int)(const void *, void *, int, int, int, int);

enum { ENTRY_LEN = 9, RECORD_LEN = 7 };

static struct {
    int ready;
    int busy; /* calls inside try_fast_here() (see try_fast) */
    unsigned long long hits; /* calls done here (tests check the path was taken) */
    void *fn;
    int pointer_handles;
    intptr_t in_place;
    /* owned references, set by configure() */
    PyObject *world, *group_type, *plan_type, *sum, *gate, *flight, *ours, *rec, *error;
    /* where __slots__ attributes live in their objects (-1: look them up by name) */
    Py_ssize_t at_plans, at_calls, at_size, at_flight_on, at_ring;
    Py_ssize_t at_fast, at_stamp, at_count, at_psize, at_gate_stamp;
    /* the ledger's layouts (_ledger.ENTRY, records.COMM_FIELDS): where each field goes */
    int e_seq, e_op, e_group, e_nbytes, e_dtype, e_peer, e_code, e_lasti, e_done;
    int r_op, r_nbytes, r_alg, r_gsize, r_start, r_dur, r_wait;
    PyObject *user_code; /* the last caller's code found outside clusterkernel (held) */
} S;

static PyObject *n_dtype, *n_is_cpu, *n_numel, *n_is_contiguous, *n_data_ptr,
    *n_all_reduce, *n_mpi, *n_on, *n_ring, *n_append, *n_calls, *n_enabled,
    *n_comm, *n_capacity, *n_trim, *n_op, *n_group, *n_async_op, *n_algorithm, *n_auto_alg,
    *n_plans, *n_size, *n_fast, *n_stamp, *n_count;

/* time.perf_counter(): CLOCK_MONOTONIC on Linux, the only system configured (the
 * timing record's start is compared with the Python path's). */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The offset of type's __slots__ attribute name (a writable object slot), or -1. */
static Py_ssize_t slot_offset(PyObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString(type, name);
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

/* a == b for two Python ints (0 when either is not one) */
static int same_int(PyObject *a, PyObject *b)
{
    return a == b || (PyLong_CheckExact(a) && PyLong_CheckExact(b) &&
                      PyObject_RichCompareBool(a, b, Py_EQ) == 1);
}

/* The call done here: 1; left to the Python path (nothing done): 0; an error: -1.
 * Decides nothing itself: the group's plan for the call's key (_reductions.py makes
 * it) holds the Python rules' answer (_plan.admit): plan.fast, the handles of MPI's
 * allreduce on a contiguous tensor's own memory with no check due, or None; valid
 * while plan.stamp is the gate's (_gate.py: the check mode, staging, an agreed set
 * changed since: Python decides again). */
static int try_fast_here(PyObject *t, PyObject *g, PyObject *op, PyObject *algorithm)
{
    PyObject *t0 = NULL, *dtype = NULL, *cpu = NULL, *numel = NULL, *key = NULL;
    PyObject *plans = NULL, *plan = NULL, *fast = NULL, *v = NULL, *entry = NULL;
    PyObject *code = NULL, *ptr_obj = NULL, *size = NULL, *count = NULL;
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
    if ((cpu = PyObject_GetAttr(t, n_is_cpu)) == NULL ||
        (numel = PyObject_CallMethodNoArgs(t, n_numel)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto error;
        PyErr_Clear(); /* not a tensor (a numpy array has a dtype): as above */
        goto fallback;
    }
    /* _reductions.all_reduce's key: (dtype, numel, op, algorithm, is_cpu) */
    if ((key = PyTuple_Pack(5, dtype, numel, op, algorithm, cpu)) == NULL)
        goto error;
    if ((plans = attr(g, S.at_plans, n_plans)) == NULL)
        goto error;
    if (!PyDict_CheckExact(plans))
        goto fallback;
    plan = PyDict_GetItemWithError(plans, key); /* borrowed; a bad key: the Python path */
    if (plan == NULL || !Py_IS_TYPE(plan, (PyTypeObject *)S.plan_type))
        goto fallback_or_error;
    Py_INCREF(plan);
    if ((fast = attr(plan, S.at_fast, n_fast)) == NULL)
        goto error;
    if (!PyTuple_CheckExact(fast) || PyTuple_GET_SIZE(fast) != 3)
        goto fallback; /* None: not a call for this path */
    { /* the answer is current: decided since the gate last moved */
        PyObject *now_stamp = attr(S.gate, S.at_gate_stamp, n_stamp);
        if (now_stamp == NULL)
            goto error;
        v = attr(plan, S.at_stamp, n_stamp);
        r = v != NULL && same_int(v, now_stamp);
        Py_DECREF(now_stamp);
        if (v == NULL)
            goto error;
        Py_CLEAR(v);
        if (!r)
            goto fallback;
    }
    /* the plan's one per-call condition: MPI works on the tensor's own memory */
    if ((v = PyObject_CallMethodNoArgs(t, n_is_contiguous)) == NULL)
        goto error;
    if (v != Py_True)
        goto fallback;
    Py_CLEAR(v);
    if ((size = attr(plan, S.at_psize, n_size)) == NULL ||
        (count = attr(plan, S.at_count, n_count)) == NULL)
        goto error;
    Py_ssize_t n = PyLong_AsSsize_t(count);
    if (n < 0 || n > INT32_MAX)
        goto fallback_or_error;
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
        PyObject *seq = attr(g, S.at_calls, n_calls);
        if (seq == NULL)
            goto error;
        Py_ssize_t k = PyLong_AsSsize_t(seq);
        PyObject *next = k == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(k + 1);
        if (next == NULL || set_attr(g, S.at_calls, n_calls, next) < 0) {
            Py_DECREF(seq);
            Py_XDECREF(next);
            goto error;
        }
        Py_DECREF(next);
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(caller));
        entry = lasti ? PyList_New(ENTRY_LEN) : NULL;
        if (entry == NULL) {
            Py_DECREF(seq);
            Py_XDECREF(lasti);
            goto error;
        }
        /* seq and lasti: references handed over */
        PyList_SET_ITEM(entry, S.e_seq, seq);
        PyList_SET_ITEM(entry, S.e_op, Py_NewRef(n_all_reduce));
        PyList_SET_ITEM(entry, S.e_group, Py_NewRef(g));
        PyList_SET_ITEM(entry, S.e_nbytes, Py_NewRef(size));
        PyList_SET_ITEM(entry, S.e_dtype, Py_NewRef(dtype));
        PyList_SET_ITEM(entry, S.e_peer, Py_NewRef(Py_None));
        PyList_SET_ITEM(entry, S.e_code, Py_NewRef(code));
        PyList_SET_ITEM(entry, S.e_lasti, lasti);
        PyList_SET_ITEM(entry, S.e_done, Py_NewRef(Py_False));
        PyObject *ring = attr(S.flight, S.at_ring, n_ring);
        v = ring ? PyObject_CallMethodOneArg(ring, n_append, entry) : NULL;
        Py_XDECREF(ring);
        if (v == NULL)
            goto error;
        Py_CLEAR(v);
    }
    if ((ptr_obj = PyObject_CallMethodNoArgs(t, n_data_ptr)) == NULL)
        goto error;
    void *buf = PyLong_AsVoidPtr(ptr_obj);
    if (buf == NULL && PyErr_Occurred())
        goto error;
    intptr_t datatype = (intptr_t)PyLong_AsVoidPtr(PyTuple_GET_ITEM(fast, 0));
    intptr_t mpi_op = (intptr_t)PyLong_AsVoidPtr(PyTuple_GET_ITEM(fast, 1));
    intptr_t comm = (intptr_t)PyLong_AsVoidPtr(PyTuple_GET_ITEM(fast, 2));
    if (PyErr_Occurred())
        goto error;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (S.pointer_handles)
        rc = ((allreduce_ptr)S.fn)((void *)S.in_place, buf, (int)n, (void *)datatype,
                                   (void *)mpi_op, (void *)comm);
    else
        rc = ((allreduce_int)S.fn)((void *)S.in_place, buf, (int)n, (int)datatype,
                                   (int)mpi_op, (int)comm);
    Py_END_ALLOW_THREADS
    if (rc != 0) { /* as mpi4py: MPI.Exception(error code) */
        PyObject *exc = PyObject_CallFunction(S.error, "i", rc);
        if (exc != NULL) {
            PyErr_SetObject(S.error, exc);
            Py_DECREF(exc);
        }
        goto error;
    }
    if (entry != NULL && PyList_SetItem(entry, S.e_done, Py_NewRef(Py_True)) < 0)
        goto error;
    if ((r = flag(S.rec, -1, n_enabled)) < 0)
        goto error;
    if (r) { /* the timing record: _ledger.close()'s */
        PyObject *gsize = attr(g, S.at_size, n_size);
        PyObject *dur = gsize ? PyFloat_FromDouble(now() - PyFloat_AS_DOUBLE(t0)) : NULL;
        PyObject *rec = dur ? PyTuple_New(RECORD_LEN) : NULL;
        if (rec == NULL) {
            Py_XDECREF(gsize);
            Py_XDECREF(dur);
            goto error;
        }
        PyTuple_SET_ITEM(rec, S.r_op, Py_NewRef(n_all_reduce));
        PyTuple_SET_ITEM(rec, S.r_nbytes, Py_NewRef(size));
        PyTuple_SET_ITEM(rec, S.r_alg, Py_NewRef(n_mpi));
        PyTuple_SET_ITEM(rec, S.r_gsize, gsize);
        PyTuple_SET_ITEM(rec, S.r_start, Py_NewRef(t0));
        PyTuple_SET_ITEM(rec, S.r_dur, Py_NewRef(dur));
        PyTuple_SET_ITEM(rec, S.r_wait, dur);
        PyObject *store = PyObject_GetAttr(S.rec, n_comm);
        r = store ? PyList_Append(store, rec) : -1;
        Py_DECREF(rec);
        if (r < 0) {
            Py_XDECREF(store);
            goto error;
        }
        Py_ssize_t len = PyList_GET_SIZE(store);
        Py_DECREF(store);
        PyObject *cap = PyObject_GetAttr(S.rec, n_capacity);
        Py_ssize_t capacity = cap ? PyLong_AsSsize_t(cap) : -1;
        Py_XDECREF(cap);
        if (capacity == -1 && PyErr_Occurred())
            goto error;
        if (len > capacity) {
            if ((v = PyObject_CallMethodOneArg(S.rec, n_trim, n_comm)) == NULL)
                goto error;
            Py_CLEAR(v);
        }
    }
    r = 1;
    S.hits++;
    goto done;

fallback_or_error:
    if (PyErr_Occurred())
        goto error;
fallback:
    r = 0;
    goto done;
error:
    r = -1;
done:
    Py_XDECREF(t0);
    Py_XDECREF(dtype);
    Py_XDECREF(cpu);
    Py_XDECREF(numel);
    Py_XDECREF(key);
    Py_XDECREF(plans);
    Py_XDECREF(plan);
    Py_XDECREF(fast);
    Py_XDECREF(v);
    Py_XDECREF(entry);
    Py_XDECREF(code);
    Py_XDECREF(ptr_obj);
    Py_XDECREF(size);
    Py_XDECREF(count);
    return r;
}

/* try_fast_here() borrows S's objects (the world group, the recorder...) across calls
 * into Python and across MPI with the GIL released: configure() waits for none of
 * them, so it refuses while any call is inside. */
static int try_fast(PyObject *t, PyObject *g, PyObject *op, PyObject *algorithm)
{
    S.busy++;
    int r = try_fast_here(t, g, op, algorithm);
    S.busy--;
    return r;
}

/* FastFunction(python_all_reduce): the public comm.all_reduce. A blocking call (the
 * tensor, then op, group (None or a Group), async_op False and algorithm, given by
 * position or keyword or by default) tries try_fast(); anything else, and every call
 * it declines, goes to the Python function with the arguments exactly as given. Being
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
        if (group == Py_None)
            group = S.world;
        if (plain && async_op == Py_False && Py_IS_TYPE(group, (PyTypeObject *)S.group_type)) {
            int r = try_fast(args[0], group, op, algorithm);
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
    Py_CLEAR(S.world);
    Py_CLEAR(S.group_type);
    Py_CLEAR(S.plan_type);
    Py_CLEAR(S.sum);
    Py_CLEAR(S.gate);
    Py_CLEAR(S.flight);
    Py_CLEAR(S.ours);
    Py_CLEAR(S.rec);
    Py_CLEAR(S.error);
    Py_CLEAR(S.user_code);
}

/* Where each name of `names` (a tuple of str) sits in the layout `fields`; -1 if
 * `fields` is not a tuple of exactly those names, in any order. */
static int layout(PyObject *fields, const char *const *names, int *const *at, int len)
{
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != len) {
        PyErr_Format(PyExc_ValueError, "a layout of %d fields is needed", len);
        return -1;
    }
    for (int i = 0; i < len; i++) {
        *at[i] = -1;
        for (int j = 0; j < len; j++) {
            PyObject *f = PyTuple_GET_ITEM(fields, j);
            if (PyUnicode_Check(f) && PyUnicode_CompareWithASCIIString(f, names[i]) == 0)
                *at[i] = j;
        }
        if (*at[i] < 0) {
            PyErr_Format(PyExc_ValueError, "the layout %R has no field %s", fields, names[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *fast_configure(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"allreduce", "pointer_handles", "in_place", "world", "plan_type",
                            "sum", "gate", "flight", "ours", "recorder", "error",
                            "entry", "record", NULL};
    unsigned long long fn, in_place;
    int pointer_handles;
    PyObject *world, *plan_type, *sum, *gate, *flight, *ours, *rec, *error;
    PyObject *entry, *record;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KpKOO!OOOO!OOOO", names, &fn, &pointer_handles,
                                     &in_place, &world, &PyType_Type, &plan_type, &sum, &gate,
                                     &flight, &PyFrozenSet_Type, &ours, &rec, &error,
                                     &entry, &record))
        return NULL;
    static const char *const entry_names[] = {"seq", "op", "group", "nbytes", "dtype",
                                              "peer", "code", "lasti", "done"};
    int *const entry_at[] = {&S.e_seq, &S.e_op, &S.e_group, &S.e_nbytes, &S.e_dtype,
                             &S.e_peer, &S.e_code, &S.e_lasti, &S.e_done};
    static const char *const record_names[] = {"op", "nbytes", "algorithm", "group_size",
                                               "start", "duration", "wait"};
    int *const record_at[] = {&S.r_op, &S.r_nbytes, &S.r_alg, &S.r_gsize,
                              &S.r_start, &S.r_dur, &S.r_wait};
    if (S.busy) {
        PyErr_SetString(PyExc_RuntimeError, "configure() while an all_reduce is in the fast path");
        return NULL;
    }
    release();
    if (layout(entry, entry_names, entry_at, ENTRY_LEN) < 0 ||
        layout(record, record_names, record_at, RECORD_LEN) < 0)
        return NULL;
    S.fn = (void *)(uintptr_t)fn;
    S.pointer_handles = pointer_handles;
    S.in_place = (intptr_t)in_place;
    S.world = Py_NewRef(world);
    S.group_type = Py_NewRef((PyObject *)Py_TYPE(world));
    S.plan_type = Py_NewRef(plan_type);
    S.sum = Py_NewRef(sum);
    S.gate = Py_NewRef(gate);
    S.flight = Py_NewRef(flight);
    S.ours = Py_NewRef(ours);
    S.rec = Py_NewRef(rec);
    S.error = Py_NewRef(error);
    S.at_plans = slot_offset(S.group_type, "_plans");
    S.at_calls = slot_offset(S.group_type, "_calls");
    S.at_size = slot_offset(S.group_type, "size");
    S.at_flight_on = slot_offset((PyObject *)Py_TYPE(flight), "on");
    S.at_ring = slot_offset((PyObject *)Py_TYPE(flight), "ring");
    S.at_fast = slot_offset(plan_type, "fast");
    S.at_stamp = slot_offset(plan_type, "stamp");
    S.at_gate_stamp = slot_offset((PyObject *)Py_TYPE(gate), "stamp");
    S.at_count = slot_offset(plan_type, "count");
    S.at_psize = slot_offset(plan_type, "size");
    S.ready = fn != 0;
    Py_RETURN_NONE;
}

static PyObject *fast_enable(PyObject *self, PyObject *on)
{
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    if (r && (S.world == NULL || S.fn == NULL)) {
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
    INTERN(n_numel, "numel");
    INTERN(n_is_contiguous, "is_contiguous");
    INTERN(n_data_ptr, "data_ptr");
    INTERN(n_all_reduce, "all_reduce");
    INTERN(n_mpi, "mpi");
    INTERN(n_on, "on");
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
    INTERN(n_plans, "_plans");
    INTERN(n_size, "size");
    INTERN(n_fast, "fast");
    INTERN(n_stamp, "stamp");
    INTERN(n_count, "count");
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
    if (m != NULL && (PyType_Ready(&FastFunctionType) < 0 ||
                      PyModule_AddObjectRef(m, "FastFunction", (PyObject *)&FastFunctionType) < 0))
        Py_CLEAR(m);
#endif
    return m;
}
