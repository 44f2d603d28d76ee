# C types for profiles/latency.py's interpolation primitives and attention blend (compiled by
# setup.py; the .py is the implementation). Table keys and values are integers below 2**53
# and queries are token counts, so their arithmetic in C doubles gives Python's results bit
# for bit.
cimport cython

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, x0=double)
cpdef tuple locate(object xs, double q)

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, x0=double, y0=double)
cpdef double interp1d(object xs, object ys, double q)

@cython.locals(i=Py_ssize_t)
cpdef Py_ssize_t bucket_index(double value, object bins, Py_ssize_t num_labels)

cpdef bucket_label(double value, object bins, object labels)

cdef class _SkewAlphas:
    cdef public object entry
    cdef public object n_bins, rate_bins, kv_bins, kp_bins
    cdef public Py_ssize_t n_n, n_rate, n_kv, n_kp
    cdef dict _memo
    cdef long long _last_key
    cdef double _last_alpha
    cpdef double alpha(self, long long pc, long long kp, long long nd, double rate, long long kv_max)
    @cython.locals(key="long long")
    cpdef double alpha_at(self, long long pc, Py_ssize_t i_n, Py_ssize_t i_rate, Py_ssize_t i_kv,
                          Py_ssize_t i_kp)

cdef class _KvFn:
    cpdef double at(self, double kv)
    @cython.locals(i="long long")
    cpdef run(self, long long kv0, long long k, double[::1] out)

cdef class _Row(_KvFn):
    cdef double[::1] xs
    cdef double[::1] ys
    cdef Py_ssize_t n
    @cython.locals(n=Py_ssize_t)
    cpdef double at(self, double kv)
    @cython.locals(n=Py_ssize_t, j=Py_ssize_t, i="long long", kv=double, first=double)
    cpdef run(self, long long kv0, long long k, double[::1] out)
    @cython.locals(lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t)
    cdef inline Py_ssize_t _bracket(self, double kv) noexcept
    @cython.locals(x0=double, y0=double)
    cdef inline double _on_bracket(self, Py_ssize_t j, double kv) except? -1

@cython.locals(total=Py_ssize_t, n=Py_ssize_t, at=Py_ssize_t, i=Py_ssize_t, view="double[::1]",
               row=_Row, built=list, xs=tuple, ys=tuple)
cpdef tuple _rows_of(object curves)

cdef double[::1] _new_run_buffer()

cdef class _Lerp(_KvFn):
    cdef _KvFn a
    cdef _KvFn b
    cdef double t
    cdef double[::1] _other
    @cython.locals(v0=double)
    cpdef double at(self, double kv)
    @cython.locals(other="double[::1]", i="long long", v0=double, t=double)
    cpdef run(self, long long kv0, long long k, double[::1] out)

cpdef long long attention_at(_KvFn fn, double kv)

@cython.locals(v="long long")
cpdef long long attention_ns_of(double value)

cdef class _AttentionLookup:
    cdef public object table
    cdef public bint ragged_nd
    cdef tuple _pc_axis
    cdef tuple _nd_axis
    cdef dict _slices
    cdef dict _nd_by_pc
    cdef dict _nearest
    cdef dict _rows
    cdef public dict _memo
    cdef public dict _pc_memo
    cdef object __weakref__
    cpdef _KvFn kv_fn(self, long long pc, long long kp, long long nd)
    @cython.locals(lo=Py_ssize_t, hi=Py_ssize_t, t=double, f0=_KvFn)
    cpdef _KvFn _blend(self, long long pc, long long kp, long long nd)
    @cython.locals(key="long long", fn=_KvFn)
    cpdef _KvFn _at_pc_cached(self, long long p, long long nd, long long kp)
    @cython.locals(lo=Py_ssize_t, hi=Py_ssize_t, t=double, c0=_KvFn, nd_axis=tuple)
    cpdef _KvFn _at_pc(self, long long p, long long nd, long long kp)
    @cython.locals(lo=Py_ssize_t, hi=Py_ssize_t, t=double, rows=tuple)
    cpdef _KvFn _corner(self, long long p, long long n, long long kp)

@cython.locals(f="long long", d=double)
cpdef long long round_even(double x)

@cython.locals(a=double, i_n=Py_ssize_t, i_rate=Py_ssize_t, i_kp=Py_ssize_t, i_kv=Py_ssize_t,
               i="long long", t_mean="long long", t_max="long long", v="long long", edge=double,
               have_maxes=bint)
cpdef _decode_run_ns(_KvFn attn, _SkewAlphas skew, double fallback, long long fixed, long long L,
                     long long nd, long long kv_mean, long long kv_max, double rate, long long k,
                     double[::1] means, double[::1] maxes, list out)

@cython.locals(nd="long long", kv_mean="long long", gap="long long", rate=double)
cpdef double _skew_rate(shape)

cdef class ProfiledLatencyModel:
    cdef public object bundle
    cdef public object model
    cdef public object tp
    cdef public object ep
    cdef public object reference_quirks
    cdef public object arch
    cdef public object _tables
    cdef public object _tp1
    cdef public object _fp_bytes
    cdef public object _bw
    cdef public list _prologue
    cdef public list _block
    cdef public list _head
    cdef public _AttentionLookup _attention
    cdef public object _moe
    cdef public object _skew_entry
    cdef public _SkewAlphas _skew
    cdef public double _alpha_fallback
    cdef public list _tok_groups
    cdef public list _seq_groups
    cdef public dict _tok_cache
    cdef public dict _moe_cache
    cdef public dict _seq_cache
    cdef double[::1] _means
    cdef double[::1] _maxes
    cdef object __weakref__

    cpdef long long _token_part(self, long long tokens)
    cpdef long long _seq_part(self, long long seqs)
    @cython.locals(pc="long long", kp="long long", nd="long long", kv_mean="long long",
                   kv_max="long long", fn=_KvFn, t_mean="long long", t_max="long long",
                   alpha=double)
    cpdef long long attention_ns(self, shape)
    @cython.locals(skew=_SkewAlphas, nd="long long")
    cpdef double skew_alpha(self, shape)
    cpdef long long moe_ns(self, shape)
    cpdef long long _moe_for_tokens(self, long long total_tokens)
    cpdef long long host_io_ns(self, shape)
    cpdef long long iteration_ns(self, shape)
    @cython.locals(nd="long long", L="long long", fixed="long long", kv_mean="long long",
                   kv_max="long long", attn=_KvFn, rate=double, out=list, first="long long",
                   piece="long long")
    cpdef list decode_steps_ns(self, shape, long long k)
