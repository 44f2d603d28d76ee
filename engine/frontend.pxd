cimport cython

cdef class ApiServer:
    cdef public object costs
    cdef public long long free_at
    cdef list _jobs
    cdef long long _seq
    cdef object _requests
    cdef public dict client_ns
    cdef public long long busy_ns
    cdef long long _ipc_ns
    cdef long long _network_ns
    cdef long long _output_step_ns
    cdef long long _output_token_ns

    @cython.locals(log=list, have=Py_ssize_t)
    cpdef outputs(self, long long key, long long step, long long end_ns, long long num_tokens)
    cdef _push(self, long long arrival, long long cost, long long kind, object a, object b)
    @cython.locals(handed=list, jobs=list, job=tuple, arrival="long long", cost="long long",
                   kind="long long", start="long long", done="long long")
    cpdef list run(self, long long t)
