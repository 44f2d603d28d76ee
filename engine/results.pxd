# C types for engine/results.py (compiled by setup.py; the .py is the implementation).
cimport cython
from engine.request cimport Request

cdef Py_ssize_t _RUN_END, _ROW_WIDTH, _INITIAL_ROWS

cdef class RequestRecords:
    cdef public list logs
    cdef public dict _log_pos
    cdef object _last_log
    cdef Py_ssize_t _last_k
    cdef public list request_id
    cdef public Py_ssize_t n
    cdef public Py_ssize_t n_runs
    cdef public object _rows
    cdef long long[:, ::1] _rv
    cdef public object _runs
    cdef long long[:, ::1] _uv

    cpdef _set_rows(self, rows)
    cpdef _set_runs(self, runs)
    @cython.locals(k=object)
    cpdef Py_ssize_t _log(self, log)
    @cython.locals(k=Py_ssize_t, u=Py_ssize_t, n=Py_ssize_t, uv="long long[:, ::1]",
                   v="long long[:, ::1]", a="long long", b="long long")
    cpdef add(self, Request req, object send_ns=*, long long instance=*)
