cimport cython
from engine.scheduler cimport DecodeSpan, Scheduler

cdef long long _MAX_CHUNK
cdef long long _NO_ROUND
cdef long long _DEFER_STEPS
cdef Py_ssize_t _PENDING_STEPS, _PENDING_MAX
cdef object _ZEROS, _ZERO_FLOATS
cdef double _INF
cdef long long _NEVER

cdef class StepLog:
    cdef object _end_ns
    cdef object _running
    cdef object _waiting
    cdef object _usage
    cdef object _prompt_tokens
    cdef object _gen_tokens
    cdef object _pend_q
    cdef long long[::1] _qv
    cdef object _pend_d
    cdef double[::1] _dv
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap
    cdef void _new_pending(self, Py_ssize_t cap)
    @cython.locals(n=Py_ssize_t, p=Py_ssize_t, qv="long long[::1]")
    cpdef add(self, long long end_ns, long long running, long long waiting, double usage,
              long long prompt_tokens, long long gen_tokens)
    @cython.locals(n=Py_ssize_t, p=Py_ssize_t)
    cpdef flush(self)
    @cython.locals(k=Py_ssize_t, n=Py_ssize_t, p=Py_ssize_t)
    cpdef extend(self, end_ns, running, waiting, usage, prompt_tokens, gen_tokens)

cdef class SpanPlan:
    cdef public list spans
    cdef public list times
    cdef public list ends
    cdef public list first_prompt
    cdef public long long[::1] finish_at_c
    cdef public long long wake
    cdef Py_ssize_t _k
    cdef Py_ssize_t _done
    cdef public list fins
    cdef public long long counted
    cdef public long long served
    cdef public list queue
    cdef public long long last
    cdef public list durs
    cdef public long long seg_start
    cdef public long long seg_end
    cdef public object shape
    cdef public list raw
    cdef public list padded
    @cython.locals(times=list, n=Py_ssize_t, k=Py_ssize_t, d=Py_ssize_t, tk="long long",
                   fins="long long[::1]")
    cpdef long long finished_before(self, long long now_ns)
    @cython.locals(d="long long", fins="long long[::1]", times=list)
    cpdef long long next_finish_ns(self, long long now_ns)

cdef class Member:
    cdef public str name
    cdef public Scheduler scheduler
    cdef public object latency
    cdef public str role
    cdef public StepLog log
    cdef public object arrived_kv
    cdef public long long num_steps
    cdef public SpanPlan deferred

cdef class EngineUnit:
    cdef public list members
    cdef public long long step_overhead_ns
    cdef public long long overhead_hidden_ns
    cdef public long long pp
    cdef public object dp_pad
    cdef public object on_finished
    cdef public long long depth
    cdef public object inflight
    cdef public long long gpu_free_at
    cdef public long long num_finished
    cdef public object waiting_for
    cdef public long long _span_step_ns
    cdef public bint fast_forward
    cdef public object deferred
    cdef public long long num_deferred
    cdef public long long num_interrupted
    cdef public long long num_extended

    @cython.locals(c="long long", h="long long")
    cpdef long long _overhead(self, long long t_gpu)
    @cython.locals(sched=Scheduler, gen="long long")
    cpdef _record(self, Member m, step, long long end_ns)
    @cython.locals(m=Member, end="long long", steps=list, members=list, j=Py_ssize_t)
    cpdef _complete_oldest(self)
    @cython.locals(sched=Scheduler, span_ok=bint, single=bint, hold=bint, reach=object,
                   j=Py_ssize_t)
    cpdef poll(self, long long t, object horizon_ns=*, object defer_ns=*)
    cpdef bint _kv_arrived(self)
    cpdef _decode_span(self, long long t, long long horizon)
    cpdef object _end_span(self, tuple done)
    @cython.locals(sched=Scheduler, last="long long", group=bint, spans=list, first_prompt=list,
                   j=Py_ssize_t, n_s="long long", span=DecodeSpan, plan=SpanPlan)
    cpdef _plan_span(self, long long t, long long horizon)
    @cython.locals(sched=Scheduler, times=list, ends=list, queue=list, nq=Py_ssize_t,
                   gpu="long long", durs=list, last="long long", chunk="long long",
                   i="long long", it="long long", start="long long", nxt="long long",
                   seg_end="long long", seg_start="long long", k="long long", group=bint,
                   spans=list, span=DecodeSpan, t_i="long long")
    cpdef _price(self, SpanPlan plan, long long horizon)
    @cython.locals(end="long long", seg_end="long long", j=Py_ssize_t, busy=bint, span=DecodeSpan)
    cpdef long long _group_segment(self, list spans, long long i, list raw, list padded)
    @cython.locals(out=list, j=Py_ssize_t, r=Py_ssize_t, c="long long", prices=list)
    cpdef list _group_rounds_ns(self, list raw, list padded, long long first, long long k)
    @cython.locals(sched=Scheduler, times=list, ends=list, ops="long long", n_s="long long",
                   n_c="long long", c="long long", m=Member, outs=list, finished=list,
                   first="long long", j=Py_ssize_t, k=Py_ssize_t, n_tail=Py_ssize_t, done=object,
                   done_v="long long[::1]",
                   prompt=object, steps=list, span=DecodeSpan)
    cpdef _run_span(self, SpanPlan plan, Py_ssize_t n_times)
    cpdef bint _hold(self, SpanPlan plan)
    @cython.locals(sched=Scheduler, ops="long long", n_s="long long", n_c="long long",
                   queue=list, span=DecodeSpan, more=list, whole="long long")
    cpdef bint _wake_of(self, SpanPlan plan)
    @cython.locals(n_times=Py_ssize_t, n_ends=Py_ssize_t)
    cpdef bint _extend(self, SpanPlan plan, long long t, long long horizon_ns,
                       long long defer_ns)
    @cython.locals(reach="long long")
    cpdef long long _reach(self, long long t, long long horizon_ns, long long defer_ns)
    cpdef interrupt(self, long long t)

@cython.locals(running="long long", sched=Scheduler, deferred=SpanPlan)
cdef double _load_score(Member m, long long now_ns)

ctypedef fused _minimum:
    double
    long long

@cython.locals(a=_minimum, b=_minimum, low=_minimum)
cdef void _set_leaf(_minimum[::1] tree, Py_ssize_t j, _minimum value) noexcept

cdef class LoadBoard:
    cdef public list members
    cdef Py_ssize_t _size
    cdef double[::1] _tree
    cdef long long[::1] _due
    cdef signed char[::1] _dirty
    cdef list _pending
    cdef long long _last_ns
    cpdef touch(self, Py_ssize_t i)
    @cython.locals(m=Member, plan=SpanPlan, nxt="long long")
    cdef _read(self, Py_ssize_t i, long long now_ns)
    @cython.locals(i=Py_ssize_t, due="long long[::1]", size=Py_ssize_t, first="long long",
                   j=Py_ssize_t, pending=list, dirty="signed char[::1]", low=double)
    cpdef Py_ssize_t pick(self, Py_ssize_t start, long long now_ns)
    @cython.locals(tree="double[::1]", j=Py_ssize_t, size=Py_ssize_t)
    cdef Py_ssize_t _first_at_most(self, Py_ssize_t start, double low)
