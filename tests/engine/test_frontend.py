"""The API server in front of the engine (engine.frontend) and its place in the event clock."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.batch import BatchShape
from engine.deployment import InstanceSpec
from engine.frontend import ApiServer, FrontEndCosts, FrontEndSpec
from engine.memory import KVCapacity
from engine.simulate import simulate_cluster
from engine.specs import ConfigError, EngineConfig, HardwareSpec
from engine.workload import RequestSpec
from profiles.catalog import load_model

MODEL = load_model("meta-llama/Llama-3.1-8B")
HW = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)

US = 1000


def _costs(**kw: int) -> FrontEndCosts:
    base = dict(request_ns=0, request_ns_per_token=0.0, intake_ns=0, intake_ns_per_token=0.0,
                output_step_ns=0, output_token_ns=0, ipc_ns=0, network_ns=0)
    base.update(kw)
    return FrontEndCosts(**base)


def test_server_serves_jobs_in_arrival_order_one_at_a_time():
    fe = ApiServer(_costs(request_ns=100, request_ns_per_token=2.0, intake_ns=3,
                          intake_ns_per_token=0.5, output_step_ns=50, output_token_ns=10,
                          ipc_ns=5, network_ns=7))
    fe.submit(0, 10, "r0", "m")  # reaches the server at 7, costs 120: done 127
    fe.outputs(0, 0, 100, 3)  # reaches it at 105, waits, costs 80: done 207
    fe.submit(110, 0, "r1", "m")  # reaches it at 117, after the output: done 307
    assert fe.next_arrival() == 7
    assert fe.run(50) == [(127 + 5 + 3 + 5, "r0", "m")]  # + ipc + intake (3 + 0.5·10)
    assert fe.run(10**9) == [(307 + 5 + 3, "r1", "m")]
    assert fe.client_ns[0] == [207 + 7]  # delivered + network
    assert fe.busy_ns == 120 + 80 + 100 and fe.next_arrival() is None


def test_a_step_without_tokens_streams_nothing():
    fe = ApiServer(_costs(output_step_ns=50))
    fe.outputs(3, 1, 100, 0)
    assert fe.next_arrival() is None and fe.client_ns[3] == [-1, -1]


def test_modes_select_their_parts():
    spec = FrontEndSpec(request_us=10, request_us_per_prompt_token=0.25, http_request_us=20,
                        tokenize_us_per_token=0.5, intake_us=7, intake_us_per_prompt_token=0.125,
                        output_step_us=3, output_token_us=4, stream_token_us=6, ipc_us=2,
                        network_us=1)
    http = spec.costs()
    assert http == FrontEndCosts(30_000, 750.0, 7_000, 125.0, 3_000, 10_000, 2_000, 1_000)
    local = FrontEndSpec(**{**_fields(spec), "mode": "in_process"}).costs()
    assert local == FrontEndCosts(10_000, 250.0, 7_000, 125.0, 3_000, 4_000, 2_000, 0)
    assert FrontEndSpec(mode="none").costs() is None


def test_the_defaults_are_the_measured_costs():
    # docs/frontend.md, "Measured costs of vLLM 0.19.1's front-end code" (minimum of 9).
    d = FrontEndSpec()
    assert d.mode == "api_server"
    assert d.request_us + d.http_request_us == pytest.approx(126.0)
    assert (d.request_us_per_prompt_token, d.tokenize_us_per_token) == (0.090, 3.36)
    assert (d.intake_us, d.intake_us_per_prompt_token) == (24.0, 0.19)
    assert (d.output_step_us, d.output_token_us, d.stream_token_us) == (27.0, 12.6, 17.1)


def _fields(spec: FrontEndSpec) -> dict:
    return {k: getattr(spec, k) for k in spec.__dataclass_fields__}


@pytest.mark.parametrize("bad, match", [
    ({"mode": "nginx"}, "frontend='nginx' is not allowed"),
    ({"request_us": -1.0}, "request_us=-1.0 is not allowed"),
    ({"ipc_us": float("inf")}, "ipc_us=inf"),
    ({"network_us": True}, "network_us=True"),
    ({"network_us": 1e16}, "network_us=1e.16 is not allowed.*below 1e.09"),
    ({"output_token_us": float("nan")}, "output_token_us=nan"),
])
def test_bad_settings_are_named(bad, match):
    with pytest.raises(ConfigError, match=match):
        FrontEndSpec(**bad)


# Every cost zero: tests set the ones they look at.
ZERO = {k: 0.0 for k in FrontEndSpec.__dataclass_fields__ if k != "mode"}


class Flat:
    """Every step costs 10 ms."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return 10_000_000

    def stage_ns(self, shape: BatchShape) -> int:
        return 10_000_000


def specs(n: int, gap_ns: int, prompt: int, output: int) -> list[RequestSpec]:
    return [RequestSpec(f"r{i}", i * gap_ns, tuple(range(1000 * i, 1000 * i + prompt)), output)
            for i in range(n)]


def _run(workload, frontend=None, n_instances=1, **cfg):
    config = EngineConfig(step_overhead_us=0.0, **cfg)
    cap = KVCapacity(num_blocks=4096, block_size=16, bytes_per_block=1, weight_bytes=0,
                     formula_num_blocks=4096)
    insts = [InstanceSpec(f"i{k}", MODEL, HW, config, Flat(), cap) for k in range(n_instances)]
    return simulate_cluster(insts, workload, frontend=frontend, router="round_robin")


SPEC = FrontEndSpec(request_us=300, request_us_per_prompt_token=0.0, http_request_us=200,
                    tokenize_us_per_token=1.0, intake_us=10, intake_us_per_prompt_token=0.1,
                    output_step_us=100, output_token_us=20, stream_token_us=30, ipc_us=50,
                    network_us=40)


def test_one_request_on_an_idle_engine_by_hand():
    wl = [RequestSpec("a", 1_000_000, tuple(range(100)), 3)]
    r = _run(wl, SPEC, async_scheduling=False).requests.iloc[0]
    # network, the server's job (500 µs + 1 µs per prompt token), ipc, the intake (10 + 0.1·100)
    engine_in = 1_000_000 + 40 * US + (500 + 100) * US + 50 * US + 20 * US
    assert r.send_ns == 1_000_000 and r.arrival_ns == engine_in
    assert r.queued_ns == engine_in  # the idle engine picks it up at once
    deliver = (50 + 100 + 50 + 40) * US  # ipc, one-token message, network
    assert list(r.client_token_times_ns) == [t + deliver for t in r.token_times_ns]
    assert r.client_first_token_ns == r.token_times_ns[0] + deliver
    assert r.client_finish_ns == r.token_times_ns[-1] + deliver


def test_no_front_end_and_mode_none_are_the_engine_itself():
    wl = specs(40, gap_ns=3_000_000, prompt=200, output=20)
    plain = _run(wl).requests
    none = _run(wl, FrontEndSpec(mode="none")).requests
    pd.testing.assert_frame_equal(plain, none)
    assert (plain.send_ns == plain.arrival_ns).all()
    assert plain.client_token_times_ns is plain.token_times_ns or all(
        a is b for a, b in zip(plain.client_token_times_ns, plain.token_times_ns, strict=True))


def test_output_work_delays_the_requests_queued_behind_it():
    wl = specs(60, gap_ns=1_000_000, prompt=50, output=40)
    light = _run(wl, FrontEndSpec(**{**ZERO, "request_us": 100})).requests
    heavy = _run(wl, FrontEndSpec(**{**ZERO, "request_us": 100, "output_token_us": 400})).requests
    lag_light = (light.arrival_ns - light.send_ns).to_numpy()
    lag_heavy = (heavy.arrival_ns - heavy.send_ns).to_numpy()
    assert lag_light.max() == 100 * US  # nothing queues: the job's own cost
    assert lag_heavy.max() > 2 * lag_light.max()  # requests waited behind streaming work
    assert (lag_heavy >= 100 * US).all()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 30),
    gap_us=st.integers(0, 20_000),
    output=st.integers(1, 12),
    req_us=st.integers(0, 2000),
    tok_us=st.integers(0, 500),
    ipc_us=st.integers(0, 300),
    net_us=st.integers(0, 300),
    instances=st.integers(1, 3),
)
def test_client_clock_invariants(n, gap_us, output, req_us, tok_us, ipc_us, net_us, instances):
    spec = FrontEndSpec(**{**ZERO, "request_us": req_us, "output_token_us": tok_us,
                           "output_step_us": 10, "ipc_us": ipc_us, "network_us": net_us})
    wl = specs(n, gap_ns=gap_us * US, prompt=30, output=output)
    df = _run(wl, spec, n_instances=instances).requests
    assert (df.arrival_ns >= df.send_ns + (req_us + ipc_us + net_us) * US).all()
    delay = (ipc_us + 10 + net_us) * US
    for eng, cli in zip(df.token_times_ns, df.client_token_times_ns, strict=True):
        assert len(eng) == len(cli) == output
        assert (cli >= eng + delay).all() and (np.diff(cli) >= 0).all()
    assert (df.client_first_token_ns > df.send_ns).all()
    assert (df.client_finish_ns >= df.client_first_token_ns).all()
    # One server per engine: each engine receives its requests in the order they were sent.
    for _, part in df.groupby("instance"):
        assert part.arrival_ns.is_monotonic_increasing
