cimport cython

cdef class BlockPool:
    cdef public Py_ssize_t num_blocks
    cdef public bint enable_caching
    cdef public list ref_cnt
    cdef public list block_hash
    cdef public object _free
    cdef public Py_ssize_t num_free
    cdef public dict cached
    cdef public long long num_evictions

    cpdef _evict(self, Py_ssize_t b)
    @cython.locals(b=Py_ssize_t)
    cpdef list get_new_blocks(self, Py_ssize_t n)
    @cython.locals(b=Py_ssize_t)
    cpdef touch(self, list blocks)
    @cython.locals(b=Py_ssize_t, r=Py_ssize_t)
    cpdef free_blocks(self, list ordered)
    @cython.locals(i=Py_ssize_t, b=Py_ssize_t, ids=list)
    cpdef cache_full_blocks(self, list blocks, list block_hashes, Py_ssize_t num_cached, Py_ssize_t num_full)
