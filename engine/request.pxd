# C types for engine/request.py (compiled by setup.py; the .py is the implementation).
cimport cython

cdef unsigned long long _M64, _MUL, _FMIX1, _FMIX2
cdef object _ZERO_ID

cdef inline unsigned long long _mix(unsigned long long h, long long token) noexcept

cdef inline unsigned long long _finalise(unsigned long long h) noexcept

@cython.locals(h="unsigned long long", i=Py_ssize_t)
cdef unsigned long long _hash_block(unsigned long long parent, const long long[::1] ids,
                                    Py_ssize_t start, Py_ssize_t n)

@cython.locals(k=Py_ssize_t, pos=Py_ssize_t, stop=Py_ssize_t, split=Py_ssize_t,
               h="unsigned long long", tok="long long")
cpdef _hash_range_blocks(unsigned long long parent, Py_ssize_t first, Py_ssize_t end,
                         Py_ssize_t block_size, Py_ssize_t prompt_len, long long p_start,
                         long long p_step, long long o_start, long long o_step,
                         unsigned long long[::1] out)

@cython.locals(i=Py_ssize_t)
cdef void _fill_range(long long[::1] out, long long start, long long step)

@cython.locals(k=Py_ssize_t)
cpdef _hash_blocks(unsigned long long parent, const long long[::1] ids, Py_ssize_t first,
                   Py_ssize_t end, Py_ssize_t block_size, unsigned long long[::1] out)

cdef class TokenLog:
    cdef public object times
    cdef public long long base

cdef class Request:
    # Field order is the object's memory layout: the fields the scheduler's per-step loops
    # read and write come first, so that one request's step work touches about three cache
    # lines (behind 64 replicas the running requests outgrow the L2 cache); the typed views'
    # slices (about 200 bytes each) and the fields read once per request come after them.
    cdef public int status
    cdef public long long num_tokens
    cdef public long long num_computed_tokens
    cdef public long long num_output_placeholders
    cdef public long long finish_at
    cdef public long long kv_check_at
    cdef public long long kv_slots
    cdef public long long kv_cache_at
    cdef public long long tok_next
    cdef public Py_ssize_t kv_num_blocks
    cdef public long long kv_num_cached
    cdef public long long _max_tokens
    cdef public object kv_table
    cdef int[::1] _table_view
    cdef public object request_id
    cdef public Py_ssize_t index
    cdef public long long arrival_ns
    cdef public long long prompt_len
    cdef public object prompt_ids
    cdef public object output_ids
    cdef public Py_ssize_t block_size
    cdef public object _block_hashes
    cdef unsigned long long[::1] _hash_view
    cdef public long long num_cached_tokens
    cdef public long long num_preemptions
    cdef public long long queued_ns
    cdef public long long first_scheduled_ns
    cdef public long long first_token_ns
    cdef public long long finish_ns
    cdef public long long prefix_hit_tokens
    cdef public long long recomputed_tokens
    cdef public tuple tok_open
    cdef public list tok_runs
    @cython.locals(h=object)
    cpdef object hashes(self, Py_ssize_t num_blocks)
    cpdef unsigned long long[::1] hash_view(self, Py_ssize_t num_blocks)
    @cython.locals(bs=Py_ssize_t, total=Py_ssize_t, h=object)
    cpdef object _sequence_hashes(self)
    @cython.locals(runs=list, o=tuple)
    cpdef list token_runs(self)
    cpdef open_block_table(self, Py_ssize_t capacity)
    @cython.locals(old=object)
    cpdef reserve_blocks(self, Py_ssize_t n)
    cpdef view_block_table(self)
    cpdef close_block_table(self)
