/* The flight recorder's ring in C (see _flightring.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_flightring.h"

#if PY_VERSION_HEX >= 0x030B0000

static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"maxlen", NULL};
    Py_ssize_t maxlen;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n:FlightRing", names, &maxlen))
        return NULL;
    if (maxlen < 1) {
        PyErr_SetString(PyExc_ValueError, "maxlen must be at least 1");
        return NULL;
    }
    FlightRing *r = (FlightRing *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->items = PyMem_Calloc((size_t)maxlen, sizeof(PyObject *));
    if (r->items == NULL) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    r->maxlen = maxlen;
    return (PyObject *)r;
}

void ck_ring_push(FlightRing *r, PyObject *x) /* steals x */
{
    if (r->len < r->maxlen) {
        r->items[(r->start + r->len) % r->maxlen] = x;
        r->len++;
        return;
    }
    PyObject *old = r->items[r->start];
    r->items[r->start] = x;
    r->start = (r->start + 1) % r->maxlen;
    Py_DECREF(old);
}

/* The oldest entry, moved to the newest place, when it can be refilled in place
 * (the ring is full and nothing else holds it); NULL otherwise. Borrowed. */
PyObject *ck_ring_recycle(FlightRing *r, Py_ssize_t size)
{
    if (r->len < r->maxlen)
        return NULL;
    PyObject *old = r->items[r->start];
    if (Py_REFCNT(old) != 1 || !PyList_CheckExact(old) || PyList_GET_SIZE(old) != size)
        return NULL;
    r->start = (r->start + 1) % r->maxlen; /* the oldest slot becomes the newest */
    return old;
}

static PyObject *ring_append(FlightRing *r, PyObject *x)
{
    ck_ring_push(r, Py_NewRef(x));
    Py_RETURN_NONE;
}

static PyObject *ring_list(FlightRing *r)
{
    PyObject *out;
    for (;;) { /* allocating may run the GC, and with it code that appends or clears */
        Py_ssize_t n = r->len;
        if ((out = PyList_New(n)) == NULL)
            return NULL;
        if (r->len == n)
            break;
        Py_DECREF(out);
    }
    for (Py_ssize_t i = 0; i < r->len; i++) /* no Python code runs in this loop */
        PyList_SET_ITEM(out, i, Py_NewRef(r->items[(r->start + i) % r->maxlen]));
    return out;
}

static int ring_clear(FlightRing *r)
{
    while (r->len > 0) {
        PyObject *old = r->items[r->start];
        r->items[r->start] = NULL;
        r->start = (r->start + 1) % r->maxlen;
        r->len--;
        Py_DECREF(old);
    }
    r->start = 0;
    return 0;
}

static PyObject *ring_clear_method(FlightRing *r, PyObject *unused)
{
    ring_clear(r);
    Py_RETURN_NONE;
}

static PyObject *ring_iter(FlightRing *r)
{
    PyObject *items = ring_list(r); /* a copy: appends during iteration change nothing */
    if (items == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(items);
    Py_DECREF(items);
    return it;
}

static Py_ssize_t ring_len(FlightRing *r) { return r->len; }

static int ring_traverse(FlightRing *r, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < r->len; i++)
        Py_VISIT(r->items[(r->start + i) % r->maxlen]);
    return 0;
}

static void ring_dealloc(FlightRing *r)
{
    PyObject_GC_UnTrack(r);
    if (r->items != NULL) {
        ring_clear(r);
        PyMem_Free(r->items);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *ring_maxlen(FlightRing *r, void *unused) { return PyLong_FromSsize_t(r->maxlen); }

static PyMethodDef ring_methods[] = {
    {"append", (PyCFunction)ring_append, METH_O, "append(entry): the newest; drops the oldest when full."},
    {"clear", (PyCFunction)ring_clear_method, METH_NOARGS, "clear(): drop every entry."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"maxlen", (getter)ring_maxlen, NULL, "the number of entries kept", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ring_as_sequence = {.sq_length = (lenfunc)ring_len};

PyTypeObject CkFlightRingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "clusterkernel.comm._fast.FlightRing",
    .tp_basicsize = sizeof(FlightRing),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "FlightRing(maxlen): the flight recorder's ring (a deque(maxlen) in C).",
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_iter = (getiterfunc)ring_iter,
    .tp_as_sequence = &ring_as_sequence,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
};

#endif
