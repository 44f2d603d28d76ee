cimport cython
from engine.block_pool cimport BlockPool
from engine.request cimport Request

cdef class KVCacheManager:
    cdef public BlockPool pool
    cdef public Py_ssize_t block_size
    cdef public long long max_model_len
    cdef public bint enable_caching
    cdef public dict req_blocks
    cdef public long long prefix_queries
    cdef public long long prefix_hits
    cdef public long long prefix_preempted_queries
    cdef public long long prefix_preempted_hits
    cdef public object tiers
    cdef public object kv_bytes_per_token

    @cython.locals(max_blocks=Py_ssize_t, hits=list, pool=BlockPool, hashes="const unsigned long long[::1]", i=Py_ssize_t, b=Py_ssize_t,
                   n="long long")
    cpdef tuple get_computed_blocks(self, Request req)
    @cython.locals(need_slots="long long", k="long long", upto="long long", total_computed="long long",
                   n_alloc="long long", held=Py_ssize_t, n=Py_ssize_t, i=Py_ssize_t, table="int[::1]")
    cpdef bint allocate_slots(self, Request req, long long num_new_tokens, long long num_new_computed_tokens=*, list hit_blocks=*)
    @cython.locals(most="long long", ahead="long long", blocks="long long")
    cpdef Py_ssize_t _table_capacity(self, Request req)
    @cython.locals(n=Py_ssize_t)
    cpdef _append_new(self, Request req, Py_ssize_t k)
    @cython.locals(bs=Py_ssize_t, slots="long long", cache_at="long long")
    cpdef _set_thresholds(self, Request req)
    @cython.locals(num_full=Py_ssize_t, done="long long")
    cpdef cache_blocks(self, Request req, long long num_tokens)
    @cython.locals(n=Py_ssize_t)
    cpdef free(self, Request req)
