# C types for profiles/latency.py's interpolation primitives (compiled by setup.py; the .py is
# the implementation). Table keys and values are integers below 2**53 and queries are token
# counts, so their arithmetic in C doubles gives Python's results bit for bit.
cimport cython

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, x0=double)
cpdef tuple locate(object xs, double q)

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, x0=double, y0=double)
cpdef double interp1d(object xs, object ys, double q)

@cython.locals(i=Py_ssize_t)
cpdef bucket_label(double value, object bins, object labels)
