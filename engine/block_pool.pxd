# C types for engine/block_pool.py (compiled by setup.py; the .py is the implementation).
cimport cython

cdef unsigned long long _EMPTY, _LOW32
cdef Py_ssize_t _NEXT, _PREV, _REF, _SLOT
cdef int _UNHASHED, _DUPLICATE

cdef class BlockPool:
    cdef public Py_ssize_t num_blocks
    cdef public bint enable_caching
    cdef int[::1] _rec
    cdef unsigned long long[::1] _bhash
    cdef public Py_ssize_t num_free
    cdef unsigned long long[::1] _itab
    cdef Py_ssize_t _imask
    cdef Py_ssize_t _ilive
    cdef dict _dupes
    cdef public long long num_evictions
    cdef public object index_listener

    cpdef int ref_of(self, Py_ssize_t b)
    @cython.locals(b=Py_ssize_t)
    cdef void _link_in_order(self)
    @cython.locals(n=Py_ssize_t, p=Py_ssize_t)
    cdef inline void _unlink(self, Py_ssize_t b)
    @cython.locals(sentinel=Py_ssize_t, tail=Py_ssize_t)
    cdef inline void _append(self, Py_ssize_t b)
    @cython.locals(mask=Py_ssize_t, i=Py_ssize_t, v="unsigned long long", lo="unsigned long long")
    cdef Py_ssize_t _find(self, unsigned long long h)
    @cython.locals(i=Py_ssize_t)
    cpdef Py_ssize_t lookup(self, unsigned long long h)
    @cython.locals(mask=Py_ssize_t, i=Py_ssize_t, v="unsigned long long", lo="unsigned long long")
    cdef Py_ssize_t _index(self, unsigned long long h, Py_ssize_t b)
    @cython.locals(mask=Py_ssize_t, j=Py_ssize_t, v="unsigned long long", home=Py_ssize_t)
    cdef void _unindex(self, Py_ssize_t i)
    @cython.locals(more=list, i=Py_ssize_t, h="unsigned long long", nxt=Py_ssize_t)
    cpdef _evict(self, Py_ssize_t b)
    @cython.locals(out=object)
    cpdef list get_new_blocks(self, Py_ssize_t n)
    @cython.locals(b=Py_ssize_t, sentinel=Py_ssize_t, i=Py_ssize_t)
    cpdef append_new_to(self, int[::1] table, Py_ssize_t start, Py_ssize_t n)
    @cython.locals(b=Py_ssize_t)
    cpdef touch(self, list blocks)
    @cython.locals(table=object)
    cpdef free_blocks(self, list ordered)
    @cython.locals(b=Py_ssize_t, r=int, i=Py_ssize_t)
    cpdef free_table(self, const int[::1] table, Py_ssize_t n)
    @cython.locals(i=Py_ssize_t, b=Py_ssize_t, more=list, h="unsigned long long")
    cpdef cache_full_blocks(self, const int[::1] blocks, const unsigned long long[::1] block_hashes, Py_ssize_t num_cached, Py_ssize_t num_full)
    cpdef double usage(self)
