cimport cython
from engine.scheduler cimport Scheduler

cdef long long _MAX_CHUNK

cdef class StepLog:
    cdef public object end_ns
    cdef public object running
    cdef public object waiting
    cdef public object usage
    cdef public object prompt_tokens
    cdef public object gen_tokens

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

    cpdef long long _overhead(self, long long t_gpu)
    cpdef _complete_oldest(self)
    @cython.locals(sched=Scheduler, span_ok=bint)
    cpdef poll(self, long long t, object horizon_ns=*)
    @cython.locals(sched=Scheduler, times=list, ends=list, gpus=list, queue=list, gpu="long long", durs=list,
                   last="long long", chunk="long long", i="long long", it="long long", start="long long",
                   nxt="long long", ops="long long", n_s="long long", n_c="long long",
                   tlog=object, waiting="long long", c="long long", tc="long long", log=StepLog,
                   seg_end="long long", seg_start="long long", k="long long", first="long long",
                   j=Py_ssize_t, done=list, prompt=list)
    cpdef _decode_span(self, long long t, long long horizon)
