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
#include <string.h>
#include <stdint.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030B0000 /* PyFrame_GetLasti */

typedef int (*allreduce_ptr)(const void *, void *, int, void *, void *, void *);
typedef int (*allreduce_int)(const void *, void *, int, int, int, int);

enum { RECORD_LEN = 7 };
enum { MEMO_SLOTS = 8 }; /* remembered plans (a power of two) */
/* a field of the comm record's layout as the ring stores it (metrics/_ring.py) */
enum { F_CODE, F_INT, F_FLOAT };

static struct {
    int ready;
    int busy; /* calls inside try_fast_here() (see try_fast) */
    unsigned long long hits; /* calls done here (tests check the path was taken) */
    void *fn;
    int pointer_handles;
    intptr_t in_place;
    /* owned references, set by configure() */
    PyObject *world, *group_type, *plan_type, *sum, *gate, *flight, *ours, *rec, *error;
    PyObject *ring; /* the timing records' ring (a CommRing), whose memory ring_base is */
    /* where __slots__ attributes live in their objects (-1: look them up by name) */
    Py_ssize_t at_plans, at_calls, at_flight_on;
    Py_ssize_t at_fast, at_stamp, at_count, at_psize, at_gate_stamp;
    Py_ssize_t at_gsize, at_op_code, at_alg_code;
    /* the flight recorder's ring (_flight.py): a slot is a row of int64 (INT_FIELDS)
     * and a row of objects (OBJ_FIELDS); where each field of an entry goes */
    int i_index, i_seq, i_nbytes, i_peer, i_lasti, i_done, o_op, o_group, o_dtype, o_code;
    Py_ssize_t ni, no, at_ints, at_objs, at_fsize;
    int64_t peer_none;
    /* the timing records' ring (metrics/_ring.py, rows of records.COMM_LAYOUT): its
     * memory (held exported, so it cannot move), and each field's byte offset in a row */
    Py_buffer ring_view;
    char *ring_base; /* an int64 count of rows ever written, then the rows */
    Py_ssize_t ring_cap, ring_row, ring_head;
    Py_ssize_t r_op, r_nbytes, r_alg, r_gsize, r_start, r_dur, r_wait;
    PyObject *user_code; /* the last caller's code found outside clusterkernel (held) */
    /* The last plans found, by what their key was made of (see memo_find): a call that
     * matches one by identity skips making the key tuple and the dict look-up. */
    struct memo {
        PyObject *plans, *dtype, *op, *alg, *plan; /* held: their addresses stay theirs */
        Py_ssize_t numel;
        int cpu;
    } memo[MEMO_SLOTS];
} S;

static PyObject *n_dtype, *n_is_cpu, *n_numel, *n_is_contiguous, *n_data_ptr,
    *n_all_reduce, *n_on, *n_ints, *n_objs, *n_calls, *n_enabled,
    *n_op, *n_group, *n_async_op, *n_algorithm, *n_auto_alg,
    *n_plans, *n_size, *n_fast, *n_stamp, *n_count, *n_gsize, *n_op_code, *n_alg_code;

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

/* obj.name as a C integer (off: its slot, or -1); -1 with an error set on failure. */
static long long int_attr(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    PyObject *v = attr(obj, off, name);
    if (v == NULL)
        return -1;
    long long r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
}

/* Flight recorder fr's storage now (it is replaced when resized; fr is S.flight or
 * another recorder of its type): its int64 rows (after
 * the count of entries ever noted), its object list's items and its size in slots. 1
 * when it is as configured, 0 when not (the Python path notes the call), -1 on error. */
static int flight_rows(PyObject *fr, int64_t **ints, PyObject ***objs, Py_ssize_t *slots)
{
    PyObject *ib = attr(fr, S.at_ints, n_ints);
    PyObject *ol = ib ? attr(fr, S.at_objs, n_objs) : NULL;
    long long size = ol ? int_attr(fr, S.at_fsize, n_size) : -1;
    int r = -1;
    if (size == -1 && PyErr_Occurred())
        goto out;
    r = 0;
    if (size < 1 || !PyByteArray_CheckExact(ib) || !PyList_CheckExact(ol) ||
        PyByteArray_GET_SIZE(ib) < (Py_ssize_t)sizeof(int64_t) * (1 + size * S.ni) ||
        PyList_GET_SIZE(ol) < size * S.no)
        goto out;
    /* borrowed: the recorder holds both (the GIL is held while they are used) */
    *ints = (int64_t *)PyByteArray_AS_STRING(ib);
    *objs = ((PyListObject *)ol)->ob_item;
    *slots = (Py_ssize_t)size;
    r = 1;
out:
    Py_XDECREF(ib);
    Py_XDECREF(ol);
    return r;
}

/* The next slot of the flight ring, taken: its rows and its entry's index (see
 * flight_rows for the result). */
static int flight_slot(PyObject *fr, int64_t **irow, PyObject ***orow, int64_t *index)
{
    int64_t *ints;
    PyObject **objs;
    Py_ssize_t slots;
    int r = flight_rows(fr, &ints, &objs, &slots);
    if (r <= 0)
        return r;
    int64_t n = ints[0];
    Py_ssize_t slot = (Py_ssize_t)(n % slots);
    *irow = ints + 1 + slot * S.ni;
    *orow = objs + slot * S.no;
    *index = n;
    ints[0] = n + 1;
    return 1;
}

/* Entry `index`'s int64 row, if the ring still holds it: 1; 0 if not; -1 on error. */
static int flight_find(int64_t index, int64_t **irow)
{
    int64_t *ints;
    PyObject **objs;
    Py_ssize_t slots;
    int r = flight_rows(S.flight, &ints, &objs, &slots);
    if (r <= 0)
        return r;
    int64_t *row = ints + 1 + (Py_ssize_t)(index % slots) * S.ni;
    if (row[S.i_index] != index)
        return 0;
    *irow = row;
    return 1;
}

/* Write a taken slot (flight_slot) as entry `index`, not done yet: its index -1 first
 * (a reader skips it), the int fields, the objects, its index last (the entry is
 * whole); the slot's previous objects are let go once it is whole, as freeing one may
 * run Python code, which must find the ring consistent. The Python path's writer too
 * (flight_write), so both paths write an entry alike. */
static void flight_fill(int64_t *irow, PyObject **orow, int64_t index, int64_t seq,
                        int64_t nbytes, int64_t peer, int64_t lasti, PyObject *op,
                        PyObject *group, PyObject *dtype, PyObject *code)
{
    irow[S.i_index] = -1;
    irow[S.i_seq] = seq;
    irow[S.i_nbytes] = nbytes;
    irow[S.i_peer] = peer;
    irow[S.i_lasti] = lasti;
    irow[S.i_done] = 0;
    PyObject *was[4] = {orow[S.o_op], orow[S.o_group], orow[S.o_dtype], orow[S.o_code]};
    orow[S.o_op] = Py_NewRef(op);
    orow[S.o_group] = Py_NewRef(group);
    orow[S.o_dtype] = Py_NewRef(dtype);
    orow[S.o_code] = Py_NewRef(code);
    irow[S.i_index] = index;
    for (int i = 0; i < 4; i++)
        Py_XDECREF(was[i]);
}

/* One timing record over the oldest row of the configured ring (ring_layout), the
 * count moved on after the row is whole. Both paths' writer (record_write). */
static void ring_put(int64_t op, int64_t nbytes, int64_t alg, int64_t gsize, double start,
                     double dur, double wait)
{
    int64_t n;
    memcpy(&n, S.ring_base, sizeof n);
    char *at = S.ring_base + S.ring_head + (n % S.ring_cap) * S.ring_row;
    memcpy(at + S.r_op, &op, 8);
    memcpy(at + S.r_alg, &alg, 8);
    memcpy(at + S.r_gsize, &gsize, 8);
    memcpy(at + S.r_nbytes, &nbytes, 8);
    memcpy(at + S.r_start, &start, 8);
    memcpy(at + S.r_dur, &dur, 8);
    memcpy(at + S.r_wait, &wait, 8);
    n++;
    memcpy(S.ring_base, &n, sizeof n);
}

/* a == b for two Python ints (0 when either is not one) */
static int same_int(PyObject *a, PyObject *b)
{
    return a == b || (PyLong_CheckExact(a) && PyLong_CheckExact(b) &&
                      PyObject_RichCompareBool(a, b, Py_EQ) == 1);
}

/* The remembered slot for a key made of these parts. */
static struct memo *memo_slot(PyObject *dtype, Py_ssize_t numel)
{
    return &S.memo[((size_t)numel ^ ((uintptr_t)dtype >> 4)) & (MEMO_SLOTS - 1)];
}

static void memo_clear(struct memo *m)
{
    Py_CLEAR(m->plans);
    Py_CLEAR(m->dtype);
    Py_CLEAR(m->op);
    Py_CLEAR(m->alg);
    Py_CLEAR(m->plan);
}

/* The plan remembered for the key (dtype, numel, op, algorithm, cpu) in the dict
 * `plans` (borrowed), or NULL. Exact: every part is compared by identity (an
 * identical object is an equal one, so the dict would find the same key), the dict by
 * identity too (held, so no other dict takes its address), and a plan is remembered
 * only while it is the dict's: a plan dropped from it (_plan.drop: a cleared cache)
 * has plan.fast None, and try_fast_here forgets a remembered plan whose answer is not
 * current. */
static PyObject *memo_find(struct memo *m, PyObject *plans, PyObject *dtype, Py_ssize_t numel,
                           PyObject *op, PyObject *alg, int cpu)
{
    if (m->plan != NULL && m->plans == plans && m->dtype == dtype && m->numel == numel &&
        m->op == op && m->alg == alg && m->cpu == cpu)
        return m->plan;
    return NULL;
}

static void memo_keep(struct memo *m, PyObject *plans, PyObject *dtype, Py_ssize_t numel,
                      PyObject *op, PyObject *alg, int cpu, PyObject *plan)
{
    struct memo was = *m; /* let go once the slot is whole (a dealloc may run code) */
    m->plans = Py_NewRef(plans);
    m->dtype = Py_NewRef(dtype);
    m->op = Py_NewRef(op);
    m->alg = Py_NewRef(alg);
    m->plan = Py_NewRef(plan);
    m->numel = numel;
    m->cpu = cpu;
    memo_clear(&was);
}

/* The call done here: 1; left to the Python path (nothing done): 0; an error: -1.
 * Decides nothing itself: the group's plan for the call's key (_reductions.py makes
 * it) holds the Python rules' answer (_plan.admit): plan.fast, the handles of MPI's
 * allreduce on a contiguous tensor's own memory with no check due, or None; valid
 * while plan.stamp is the gate's (_gate.py: the check mode, staging, an agreed set
 * changed since: Python decides again). */
static int try_fast_here(PyObject *t, PyObject *g, PyObject *op, PyObject *algorithm)
{
    PyObject *dtype = NULL, *cpu = NULL, *numel = NULL, *key = NULL;
    PyObject *plans = NULL, *plan = NULL, *fast = NULL, *v = NULL;
    struct memo *memo = NULL;
    int remembered = 1; /* plan came from the memo */
    int64_t entry_n = -1, *irow;
    PyObject **orow;
    PyObject *code = NULL, *ptr_obj = NULL, *size = NULL, *count = NULL;
    PyFrameObject *caller; /* borrowed */
    int r;
    double t0 = now();
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
    Py_ssize_t n_el = PyLong_AsSsize_t(numel);
    if (n_el == -1 && PyErr_Occurred())
        goto error;
    int cpu_flag = cpu == Py_True ? 1 : cpu == Py_False ? 0 : -1;
    if ((plans = attr(g, S.at_plans, n_plans)) == NULL)
        goto error;
    if (!PyDict_CheckExact(plans))
        goto fallback;
    memo = memo_slot(dtype, n_el);
    plan = memo_find(memo, plans, dtype, n_el, op, algorithm, cpu_flag);
    if (plan == NULL) {
        remembered = 0;
        /* _reductions.all_reduce's key: (dtype, numel, op, algorithm, is_cpu) */
        if ((key = PyTuple_Pack(5, dtype, numel, op, algorithm, cpu)) == NULL)
            goto error;
        plan = PyDict_GetItemWithError(plans, key); /* borrowed; a bad key: Python's */
        if (plan == NULL || !Py_IS_TYPE(plan, (PyTypeObject *)S.plan_type))
            goto fallback_or_error;
    }
    Py_INCREF(plan);
    if ((fast = attr(plan, S.at_fast, n_fast)) == NULL)
        goto error;
    if (!PyTuple_CheckExact(fast) || PyTuple_GET_SIZE(fast) != 3)
        goto stale; /* None: not a call for this path */
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
            goto stale;
    }
    if (!remembered && cpu_flag >= 0)
        memo_keep(memo, plans, dtype, n_el, op, algorithm, cpu_flag, plan);
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
        Py_DECREF(seq);
        PyObject *next = k == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(k + 1);
        if (next == NULL || set_attr(g, S.at_calls, n_calls, next) < 0) {
            Py_XDECREF(next);
            goto error;
        }
        Py_DECREF(next);
        int64_t nbytes = PyLong_AsLongLong(size);
        if (nbytes == -1 && PyErr_Occurred())
            goto error;
        /* one slot of the flight recorder's preallocated ring, written in place */
        r = flight_slot(S.flight, &irow, &orow, &entry_n);
        if (r <= 0)
            goto fallback_or_error; /* a ring not as configured: the Python path */
        flight_fill(irow, orow, entry_n, k, nbytes, S.peer_none, PyFrame_GetLasti(caller),
                    n_all_reduce, g, dtype, code);
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
    if (entry_n >= 0) { /* done: if its slot still holds it (the ring may have moved) */
        r = flight_find(entry_n, &irow);
        if (r < 0)
            goto error;
        if (r)
            irow[S.i_done] = 1;
    }
    if ((r = flag(S.rec, -1, n_enabled)) < 0)
        goto error;
    if (r) { /* the timing record, _ledger.close()'s: one row of the ring, in place */
        int64_t row[3];
        double dur = now() - t0;
        if ((row[0] = int_attr(plan, S.at_op_code, n_op_code)) == -1 ||
            (row[1] = int_attr(plan, S.at_alg_code, n_alg_code)) == -1 ||
            (row[2] = int_attr(plan, S.at_gsize, n_gsize)) == -1) {
            if (PyErr_Occurred())
                goto error;
        }
        int64_t rec_bytes = PyLong_AsLongLong(size);
        if (rec_bytes == -1 && PyErr_Occurred())
            goto error;
        ring_put(row[0], rec_bytes, row[1], row[2], t0, dur, dur); /* blocking: all wait */
    }
    r = 1;
    S.hits++;
    goto done;

stale: /* the plan's answer says Python: forget it here until it is the dict's again */
    if (remembered && memo != NULL)
        memo_clear(memo);
    goto fallback;
fallback_or_error:
    if (PyErr_Occurred())
        goto error;
fallback:
    r = 0;
    goto done;
error:
    r = -1;
done:
    Py_XDECREF(dtype);
    Py_XDECREF(cpu);
    Py_XDECREF(numel);
    Py_XDECREF(key);
    Py_XDECREF(plans);
    Py_XDECREF(plan);
    Py_XDECREF(fast);
    Py_XDECREF(v);
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
    if (S.ring_base != NULL) {
        PyBuffer_Release(&S.ring_view);
        S.ring_base = NULL;
    }
    Py_CLEAR(S.ring);
    Py_CLEAR(S.user_code);
    for (int i = 0; i < MEMO_SLOTS; i++)
        memo_clear(&S.memo[i]);
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

/* ring.name as a Py_ssize_t, or -1 with an error set */
static Py_ssize_t size_attr(PyObject *ring, const char *name)
{
    PyObject *v = PyObject_GetAttrString(ring, name);
    Py_ssize_t r = v ? PyLong_AsSsize_t(v) : -1;
    Py_XDECREF(v);
    return r;
}

/* The timing records' ring (a metrics._ring.CommRing): its memory, held exported so
 * it stays where it is, its shape, and where each field of a row goes, from its
 * `offsets` ((field, type, byte offset) for each field of records.COMM_LAYOUT). A
 * field this code writes that the layout lacks, or has with another type, is refused. */
static int ring_layout(PyObject *ring)
{
    static const char *const names[] = {"op", "nbytes", "algorithm", "group_size",
                                        "start", "duration", "wait"};
    static const char *const types[] = {"str", "int", "str", "int", "float", "float", "float"};
    Py_ssize_t *const at[] = {&S.r_op, &S.r_nbytes, &S.r_alg, &S.r_gsize,
                              &S.r_start, &S.r_dur, &S.r_wait};
    PyObject *offsets = PyObject_GetAttrString(ring, "offsets");
    if (offsets == NULL)
        return -1;
    int ok = PyTuple_Check(offsets);
    for (int i = 0; ok && i < RECORD_LEN; i++) {
        *at[i] = -1;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(offsets); j++) {
            PyObject *f = PyTuple_GET_ITEM(offsets, j);
            if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 3) {
                ok = 0;
                break;
            }
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(f, 0), names[i]) == 0 &&
                PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(f, 1), types[i]) == 0)
                *at[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 2));
        }
        if (*at[i] < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "the ring's layout %R has no %s field %s",
                             offsets, types[i], names[i]);
            Py_DECREF(offsets);
            return -1;
        }
    }
    Py_DECREF(offsets);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "the ring's offsets are (field, type, offset) tuples");
        return -1;
    }
    S.ring_cap = size_attr(ring, "capacity");
    S.ring_row = size_attr(ring, "row_size");
    S.ring_head = size_attr(ring, "header");
    if (S.ring_cap < 1 || S.ring_row < 8 * RECORD_LEN || S.ring_head < 8) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a ring of one row or more, 8-byte fields");
        return -1;
    }
    PyObject *mem = PyObject_GetAttrString(ring, "mem");
    if (mem == NULL)
        return -1;
    int r = PyObject_GetBuffer(mem, &S.ring_view, PyBUF_WRITABLE);
    Py_DECREF(mem);
    if (r < 0)
        return -1;
    if (S.ring_view.len < S.ring_head + S.ring_cap * S.ring_row) {
        PyBuffer_Release(&S.ring_view);
        PyErr_SetString(PyExc_ValueError, "the ring's memory is smaller than its rows");
        return -1;
    }
    S.ring_base = S.ring_view.buf;
    S.ring = Py_NewRef(ring);
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
    static const char *const int_names[] = {"index", "seq", "nbytes", "peer", "lasti", "done"};
    int *const int_at[] = {&S.i_index, &S.i_seq, &S.i_nbytes, &S.i_peer, &S.i_lasti, &S.i_done};
    static const char *const obj_names[] = {"op", "group", "dtype", "code"};
    int *const obj_at[] = {&S.o_op, &S.o_group, &S.o_dtype, &S.o_code};
    if (S.busy) {
        PyErr_SetString(PyExc_RuntimeError, "configure() while an all_reduce is in the fast path");
        return NULL;
    }
    release();
    /* entry: (INT_FIELDS, OBJ_FIELDS, PEER_NONE) of _flight.py */
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
        PyErr_SetString(PyExc_ValueError, "entry is (int fields, object fields, peer none)");
        return NULL;
    }
    if (layout(PyTuple_GET_ITEM(entry, 0), int_names, int_at, 6) < 0 ||
        layout(PyTuple_GET_ITEM(entry, 1), obj_names, obj_at, 4) < 0 || ring_layout(record) < 0)
        return NULL;
    S.ni = 6;
    S.no = 4;
    S.peer_none = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 2));
    if (S.peer_none == -1 && PyErr_Occurred())
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
    S.at_flight_on = slot_offset((PyObject *)Py_TYPE(flight), "on");
    S.at_ints = slot_offset((PyObject *)Py_TYPE(flight), "ints");
    S.at_objs = slot_offset((PyObject *)Py_TYPE(flight), "objs");
    S.at_fsize = slot_offset((PyObject *)Py_TYPE(flight), "size");
    S.at_fast = slot_offset(plan_type, "fast");
    S.at_stamp = slot_offset(plan_type, "stamp");
    S.at_gate_stamp = slot_offset((PyObject *)Py_TYPE(gate), "stamp");
    S.at_count = slot_offset(plan_type, "count");
    S.at_psize = slot_offset(plan_type, "size");
    S.at_gsize = slot_offset(plan_type, "gsize");
    S.at_op_code = slot_offset(plan_type, "op_code");
    S.at_alg_code = slot_offset(plan_type, "alg_code");
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

/* args[i] as an int64 into *out; 0, or -1 with an error set */
static int int64_arg(PyObject *v, int64_t *out)
{
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* flight_write(recorder, seq, op, group, nbytes, dtype, peer, code, lasti) -> entry:
 * FlightRecorder.record's write (what it worked out from the caller: the sequence
 * number, the peer (PEER_NONE for a collective), the caller's code and offset), done
 * as the C path writes its own entries. Every value is read before the slot is taken:
 * a bad one leaves the ring as it was. */
static PyObject *fast_flight_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t seq, nbytes, peer, lasti, index, *irow;
    PyObject **orow;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "flight_write takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    if (S.flight == NULL || !Py_IS_TYPE(args[0], Py_TYPE(S.flight))) {
        PyErr_SetString(PyExc_TypeError, "flight_write writes a configured FlightRecorder");
        return NULL;
    }
    if (int64_arg(args[1], &seq) < 0 || int64_arg(args[4], &nbytes) < 0 ||
        int64_arg(args[6], &peer) < 0 || int64_arg(args[8], &lasti) < 0)
        return NULL;
    int r = flight_slot(args[0], &irow, &orow, &index);
    if (r <= 0) {
        if (r == 0)
            PyErr_SetString(PyExc_ValueError, "the recorder's ring is not as configured");
        return NULL;
    }
    flight_fill(irow, orow, index, seq, nbytes, peer, lasti, args[2], args[3], args[5], args[7]);
    return PyLong_FromLongLong(index);
}

/* record_write(ring, op, nbytes, algorithm, group_size, start, duration, wait):
 * CommRing.write_codes into the configured ring, as the C path writes its records.
 * Every value is read before the row is taken: a bad one records nothing. */
static PyObject *fast_record_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t op, nbytes, alg, gsize;
    double t[3];
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "record_write takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    if (S.ring_base == NULL || args[0] != S.ring) {
        PyErr_SetString(PyExc_ValueError, "record_write writes the configured ring only");
        return NULL;
    }
    if (int64_arg(args[1], &op) < 0 || int64_arg(args[2], &nbytes) < 0 ||
        int64_arg(args[3], &alg) < 0 || int64_arg(args[4], &gsize) < 0)
        return NULL;
    for (int i = 0; i < 3; i++)
        if ((t[i] = PyFloat_AsDouble(args[5 + i])) == -1.0 && PyErr_Occurred())
            return NULL;
    ring_put(op, nbytes, alg, gsize, t[0], t[1], t[2]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"flight_write", (PyCFunction)(void (*)(void))fast_flight_write, METH_FASTCALL,
     "flight_write(recorder, seq, op, group, nbytes, dtype, peer, code, lasti) -> int: "
     "one flight entry, written as the C path writes its own."},
    {"record_write", (PyCFunction)(void (*)(void))fast_record_write, METH_FASTCALL,
     "record_write(ring, op, nbytes, algorithm, group_size, start, duration, wait): one "
     "timing record (CommRing.write_codes) into the configured ring."},
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
    INTERN(n_on, "on");
    INTERN(n_ints, "ints");
    INTERN(n_objs, "objs");
    INTERN(n_calls, "_calls");
    INTERN(n_enabled, "enabled");
    INTERN(n_op, "op");
    INTERN(n_group, "group");
    INTERN(n_async_op, "async_op");
    INTERN(n_algorithm, "algorithm");
    INTERN(n_auto_alg, "auto");
    INTERN(n_plans, "_plans");
    INTERN(n_size, "size");
    INTERN(n_fast, "fast");
    INTERN(n_stamp, "stamp");
    INTERN(n_gsize, "gsize");
    INTERN(n_op_code, "op_code");
    INTERN(n_alg_code, "alg_code");
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
