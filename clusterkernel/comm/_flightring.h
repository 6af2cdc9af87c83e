/* FlightRing(maxlen): the flight recorder's ring, a deque(maxlen=...) for what
 * _flight.py does with it (append, iterate oldest first, len, clear, maxlen). In C
 * so that all_reduce's fast path (_fast.c) appends without a method call and, once
 * the ring is full, refills the oldest entry in place instead of making a new list:
 * only when nothing else holds that entry (a reader's copy of the ring, a pending
 * Work), so no one ever sees an entry change under them. */
#ifndef CLUSTERKERNEL_FLIGHTRING_H
#define CLUSTERKERNEL_FLIGHTRING_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject **items;
    Py_ssize_t maxlen, start, len;
} FlightRing;

extern PyTypeObject CkFlightRingType;

/* Append x, dropping the oldest entry when full; steals the reference to x. */
void ck_ring_push(FlightRing *r, PyObject *x);

/* The oldest entry, moved to the newest place, when it can be refilled in place
 * (the ring is full, it is a list of `size` items, and nothing else holds it);
 * NULL otherwise. Borrowed. */
PyObject *ck_ring_recycle(FlightRing *r, Py_ssize_t size);

#endif
