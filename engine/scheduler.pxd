cimport cython
from engine.block_pool cimport BlockPool
from engine.kv_cache cimport KVCacheManager
from engine.request cimport Request, TokenLog

@cython.locals(s="long long", c="long long")
cpdef long long _first_kv_schedule(Request r, long long c0, bint async_)

cdef long long _NO_OP
cdef object _TUPLE_NEW

cdef inline object _shape(long long total, long long seqs, long long pc, long long kp, long long nd,
                          long long dsum, long long dmin, long long dmax)
cdef object _ZEROS, _NO_OPS, _ZERO_FLOATS

@cython.locals(s="long long", u="long long")
cdef inline (long long, long long) _next_checks(Request r, long long op, long long c0, long long lag, bint cache_async)

cdef inline long long _schedules_of(long long stop, long long n_s)

@cython.locals(m="long long", p=Py_ssize_t)
cdef long long _first_due(long long[::1] next_s, long long[::1] next_u, long long[::1] fin)

@cython.locals(p=Py_ssize_t, fin="long long[::1]", room="long long[::1]", out=list, c="long long")
cpdef list span_finishes(DecodeSpan span, long long after, long long upto)

cdef class DecodeSpan:
    cdef public long long max_completions
    cdef public long long lag
    cdef public object c0
    cdef public object room
    cdef public object stop
    cdef public object fin
    cdef public object next_s
    cdef public object next_u
    cdef public list openers

cdef class ScheduledStep:
    cdef public list reqs
    cdef public list num_tokens
    cdef public list samples
    cdef public list preempted
    cdef public object shape
    cdef public long long total_tokens
    cdef public long long prompt_tokens
    cdef public long long extra_ns

cdef class Scheduler:
    cdef public KVCacheManager kv
    cdef public bint one_token_in_flight
    cdef public bint chunked_prefill
    cdef public long long max_num_seqs
    cdef public long long token_budget
    cdef public long long max_model_len
    cdef public long long threshold
    cdef public bint reserve_full_isl
    cdef public bint async_scheduling
    cdef public object waiting
    cdef public list running
    cdef public list _unqueued
    cdef public long long num_preemptions
    cdef public long long num_finished
    cdef public long long span_steps
    cdef public long long span_steps_queued
    cdef public TokenLog token_log

    cpdef _preempt(self, Request victim)
    @cython.locals(r=Request, req=Request, victim=Request, budget="long long", thr="long long", max_len_m1="long long",
                   async_=bint, one_in_flight=bint, total="long long", pc="long long", kp="long long", nd="long long",
                   dsum="long long", dmin="long long", dmax="long long", computed="long long", ph="long long",
                   num_tokens="long long", n="long long", after="long long", scheduled=bint, tiered=bint,
                   looked_up=bint, resumed=bint, running=list, reqs=list, ntoks=list, samples=list)
    cpdef schedule(self, long long now_ns)
    @cython.locals(running=list, n=Py_ssize_t, nxt="long long", async_=bint, lag="long long", ph="long long",
                   last=Request, r=Request, cache_async=bint, max_len="long long", limit="long long",
                   c0="long long[::1]", next_s="long long[::1]",
                   next_u="long long[::1]", pos=Py_ssize_t,
                   c="long long", nt="long long", fa="long long", room="long long", i="long long", op="long long", q="long long",
                   openers=list, finishes=bint, lo_room="long long", hi_room="long long", rooms="long long[::1]",
                   stops="long long[::1]", fins="long long[::1]")
    cpdef steady_decode(self, list inflight)
    @cython.locals(stop="long long[::1]", c0="long long[::1]", n="long long", dsum="long long", dmin="long long",
                   dmax="long long", end="long long", p=Py_ssize_t, s="long long", c="long long")
    cpdef tuple span_segment(self, DecodeSpan span, long long i, list members=*)
    @cython.locals(lim_c="long long", ops="long long")
    cpdef long long span_ops(self, DecodeSpan span, long long n_times)
    @cython.locals(bs="long long", running=list, c0="long long[::1]", stop="long long[::1]", need="long long",
                   p=Py_ssize_t, sc="long long", extra="long long", r=Request)
    cpdef bint span_blocks_serve(self, DecodeSpan span, long long n_s)
    @cython.locals(running=list, kv=KVCacheManager, pool=BlockPool, async_=bint, cache_async=bint,
                   n_ops_max="long long", lag="long long", c0="long long[::1]", room="long long[::1]",
                   stop="long long[::1]", fin="long long[::1]", next_s="long long[::1]", next_u="long long[::1]",
                   due="long long", todo=list, n=Py_ssize_t, max_c="long long", gen_v="long long[::1]",
                   run_v="long long[::1]", usage_v="double[::1]", finished=list,
                   sizes=list, n_run=Py_ssize_t, size=Py_ssize_t, cut="long long", op="long long", i="long long",
                   need="long long", p=Py_ssize_t, r=Request, c="long long", after="long long", nt="long long",
                   nt0="long long", upto="long long", k="long long", done_s="long long", done_c="long long",
                   log=TokenLog, k1=Py_ssize_t, nxt="long long", tail=list, sc="long long", cc="long long",
                   j="long long", members=list, kept=list, fin_state=int)
    cpdef decode_span(self, DecodeSpan span, list times)
    @cython.locals(finished=list, kv=KVCacheManager, async_=bint, cache_async=bint, max_len="long long",
                   k="long long", g="long long", req=Request, nt="long long", ph="long long", upto="long long",
                   reqs=list, samples=list, j=Py_ssize_t, fin=int, run=int)
    cpdef list update_from_output(self, step, long long now_ns)
