"""BinaryBackend: missing-binary errors, input writing and output parsing with a fake binary;
the backend wired into a deployment (``comm_backend: astra_sim``)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from astra_bridge import BinaryBackend, BinaryBackendError, CommBackend, SystemConfig, Topology
from astra_bridge.binary import parse_finish_times
from astra_bridge.chakra_et import (
    FORK_NODE_TYPES,
    collective_node,
    decode_records,
    encode_trace,
    parse_fields,
)
from astra_bridge.topology import load_network_config, load_system_config
from engine.specs import ConfigError, SettingError

TOPO = Topology.from_lists(["Switch", "Switch"], [2, 2], [400, 50], [100, 500])
SYSTEM = SystemConfig(local_mem_bw_gbps=768, dataset_splits=2)

# A stand-in for the interactive ASTRA-Sim fork: it reads its inputs, decodes each NPU's trace
# (first node's comm_size attribute), reports "finished" for every NPU with a node at
# T = comm_size + 10*npu, prompting "Waiting" after each report, and expects "done" until all
# have reported, then "exit". It records what it saw in $FAKE_ASTRA_LOG.
FAKE = r"""
import json, os, sys, glob

def varint(b, p):
    v = s = 0
    while True:
        x = b[p]; p += 1; v |= (x & 0x7F) << s; s += 7
        if not x & 0x80:
            return v, p

def fields(m):
    out, p = [], 0
    while p < len(m):
        k, p = varint(m, p)
        if k & 7 == 0:
            v, p = varint(m, p)
        else:
            n, p = varint(m, p); v = m[p:p + n]; p += n
        out.append((k >> 3, v))
    return out

args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
prefix = args["workload-configuration"]
seen = {"args": args, "npus": {}}
for path in sorted(glob.glob(prefix + ".*.et")):
    npu = int(path.rsplit(".", 2)[1])
    data = open(path, "rb").read()
    recs, p = [], 0
    while p < len(data):
        n, p = varint(data, p); recs.append(data[p:p + n]); p += n
    nodes = []
    for r in recs[1:]:
        f = fields(r)
        attrs = {}
        for no, v in f:
            if no == 10:
                af = fields(v)
                if af[1][0] == 28:  # bool_list: a BoolList, its values packed in field 1
                    packed, q, flags = fields(af[1][1])[0][1], 0, []
                    while q < len(packed):
                        b, q = varint(packed, q); flags.append(bool(b))
                    attrs[af[0][1].decode()] = flags
                else:
                    attrs[af[0][1].decode()] = af[1][1]
        nodes.append({"type": dict(f)[3], "attrs": attrs})
    seen["npus"][npu] = nodes
seen["network"] = open(args["network-configuration"]).read()
seen["system"] = json.load(open(args["system-configuration"]))
answers = []
busy = [n for n, nodes in sorted(seen["npus"].items()) if nodes]
for npu in busy:
    t = seen["npus"][npu][0]["attrs"]["comm_size"] + 10 * npu
    print(f"[workload] [info] sys[{npu}] iteration 0 finished, {t} cycles, exposed communication {t} cycles.")
    print("Waiting for workload...", flush=True)
    answers.append(sys.stdin.readline().strip())
seen["answers"] = answers
json.dump(seen, open(os.environ["FAKE_ASTRA_LOG"], "w"))
sys.exit(0 if answers[-1] == "exit" and set(answers[:-1]) <= {"done"} else 3)
"""


def make_exe(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    log = tmp_path / "seen.json"
    monkeypatch.setenv("FAKE_ASTRA_LOG", str(log))
    return make_exe(tmp_path / "AstraSim_fake", FAKE), log


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BinaryBackendError, match="no file at .*AstraSim_Analytical"):
        BinaryBackend(tmp_path / "nope", TOPO, SYSTEM)


def test_non_executable_binary_is_rejected(tmp_path: Path) -> None:
    p = tmp_path / "astra"
    p.write_text("not a program")
    p.chmod(0o644)
    if os.access(p, os.X_OK):
        pytest.skip("running as a user who can execute any file")
    with pytest.raises(BinaryBackendError, match="not executable"):
        BinaryBackend(p, TOPO, SYSTEM)


def test_collective_inputs_written_and_time_parsed(fake_binary: tuple[Path, Path]) -> None:
    exe, log = fake_binary
    backend = BinaryBackend(exe, TOPO, SYSTEM)
    assert backend.collective_ns("reduce-scatter", 4096) == 4096 + 30
    seen = json.loads(log.read_text())
    assert sorted(seen["npus"]) == ["0", "1", "2", "3"]
    for nodes in seen["npus"].values():
        assert len(nodes) == 1
        node = nodes[0]
        assert node["type"] == FORK_NODE_TYPES["COLL"]
        assert node["attrs"] == {"is_cpu_op": 0, "comm_type": 7, "comm_size": 4096}
    assert seen["answers"] == ["done", "done", "done", "exit"]
    assert seen["args"]["start-npu-ids"] == "0,1,2,3,"
    assert seen["system"]["preferred-dataset-splits"] == 2
    assert seen["system"]["local-mem-bw"] == 768
    # the written configs read back into the same model inputs
    Path(log.parent / "net.yml").write_text(seen["network"])
    assert load_network_config(log.parent / "net.yml") == TOPO
    (log.parent / "sys.json").write_text(json.dumps(seen["system"]))
    assert load_system_config(log.parent / "sys.json") == SYSTEM


def test_results_are_cached(fake_binary: tuple[Path, Path]) -> None:
    exe, log = fake_binary
    backend = BinaryBackend(exe, TOPO, SYSTEM)
    backend.collective_ns("all-reduce", 100)
    log.unlink()
    assert backend.collective_ns("ALLREDUCE", 100) == 130
    assert not log.exists()  # no second run


def test_p2p_writes_send_and_recv_only(fake_binary: tuple[Path, Path]) -> None:
    exe, log = fake_binary
    backend = BinaryBackend(exe, TOPO, SYSTEM, workdir=log.parent / "runs", keep_files=True)
    assert backend.p2p_ns(1000, 0, 3) == 1030
    seen = json.loads(log.read_text())
    assert [len(seen["npus"][k]) for k in ("0", "1", "2", "3")] == [1, 0, 0, 1]
    send, recv = seen["npus"]["0"][0], seen["npus"]["3"][0]
    assert (send["type"], recv["type"]) == (FORK_NODE_TYPES["SEND"], FORK_NODE_TYPES["RECV"])
    assert send["attrs"]["comm_src"] == 0 and send["attrs"]["comm_dst"] == 3
    assert seen["answers"] == ["done", "exit"]
    assert list((log.parent / "runs").iterdir())  # kept for inspection


def test_failed_run_reports_output(tmp_path: Path) -> None:
    exe = make_exe(
        tmp_path / "crash", "import sys\nprint('assertion chunk_size > 0 failed')\nsys.exit(134)\n"
    )
    with pytest.raises(BinaryBackendError, match="(?s)code 134.*chunk_size"):
        BinaryBackend(exe, TOPO, SYSTEM).collective_ns("all-reduce", 8)


def test_hung_run_times_out(tmp_path: Path) -> None:
    exe = make_exe(tmp_path / "hang", "import time\ntime.sleep(30)\n")
    with pytest.raises(BinaryBackendError, match="did not finish within 0.3s"):
        BinaryBackend(exe, TOPO, SYSTEM, timeout_s=0.3).collective_ns("all-reduce", 8)


def test_parse_finish_times() -> None:
    out = (
        "[workload] [info] sys[1] iteration 0 finished, 2376 cycles, exposed communication 2376 cycles.\n"
        "Waiting\n[workload] [info] sys[0] iteration 0 finished, 2370 cycles, exposed communication 1 cycles.\n"
    )
    assert parse_finish_times(out) == {1: 2376, 0: 2370}


def test_et_encoding_round_trip() -> None:
    data = encode_trace([collective_node("all-gather", 300)])
    meta, node = decode_records(data)
    assert parse_fields(meta) == [(1, b"0.0.4")]
    f = parse_fields(node)
    assert f[:3] == [(1, 0), (2, b"ALL_GATHER"), (3, 8)]
    attrs = {parse_fields(v)[0][1]: parse_fields(v)[1] for no, v in f if no == 10}
    assert attrs == {b"is_cpu_op": (27, 0), b"comm_type": (9, 2), b"comm_size": (9, 300)}


def test_collective_over_some_dimensions_writes_involved_dim(fake_binary: tuple[Path, Path]) -> None:
    exe, log = fake_binary
    backend = BinaryBackend(exe, TOPO, SYSTEM)
    assert backend.collective_ns("all-reduce", 64, involved_dims=(True, False)) == 64 + 30
    seen = json.loads(log.read_text())
    assert seen["npus"]["0"][0]["attrs"]["involved_dim"] == [True, False]
    log.unlink()
    backend.collective_ns("all-reduce", 64, involved_dims=(True, True))  # another shape: runs
    assert "involved_dim" not in json.loads(log.read_text())["npus"]["0"][0]["attrs"]
    log.unlink()
    backend.collective_ns("all-reduce", 64, involved_dims=[True, False])  # cached
    assert not log.exists()
    with pytest.raises(ConfigError, match="2 dimensions"):
        backend.collective_ns("all-reduce", 64, involved_dims=(True,))


def test_et_bool_list_attribute_round_trip() -> None:
    node = collective_node("all-gather", 8, involved_dims=(False, True, True))
    f = parse_fields(node.encode())
    attrs = [parse_fields(v) for no, v in f if no == 10]
    name, (field_no, body) = attrs[-1]
    assert name == (1, b"involved_dim") and field_no == 28
    assert parse_fields(body) == [(1, b"\x00\x01\x01")]  # packed varints 0, 1, 1


def test_comm_backend_names_the_key_and_the_fix(tmp_path: Path) -> None:
    assert CommBackend() == CommBackend("analytical", None)
    with pytest.raises(SettingError, match="comm_backend='ns3' is not allowed"):
        CommBackend("ns3")
    with pytest.raises(SettingError, match="astra_sim_binary=None is not allowed.*give its path"):
        CommBackend("astra_sim")
    err = pytest.raises(SettingError, CommBackend, "astra_sim", str(tmp_path / "nope")).value
    assert "cluster.astra_sim_binary=" in str(err.named("cluster.")) and "no file at" in str(err)
    with pytest.raises(SettingError, match="astra_sim_binary='x' is not allowed; allowed: null"):
        CommBackend("analytical", "x")


def test_binary_backend_shared_per_network(fake_binary: tuple[Path, Path]) -> None:
    exe, _ = fake_binary
    cb = CommBackend("astra_sim", str(exe))
    net = cb.network(TOPO, SYSTEM)
    assert isinstance(net, BinaryBackend)
    assert cb.network(TOPO, SYSTEM) is net  # one memo per (binary, topology, system)
    assert CommBackend().network(TOPO, SYSTEM).collective_ns("all-reduce", 4096) > 0


def _sweep_cfg(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sweep.schema import register

    register()
    GlobalHydra.instance().clear()
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    GlobalHydra.instance().clear()
    return cfg


def test_sweep_point_selects_the_binary_per_collective_shape(
    fake_binary: tuple[Path, Path],
) -> None:
    from engine.simulate import simulate_deployment
    from profiles.parallel.latency import ParallelLatencyModel
    from sweep.cluster import build_deployment
    from workloads import synthetic

    exe, log = fake_binary
    base = ["cluster=tp2", "hardware=h100_sxm", "model=llama3_8b"]
    cfg = _sweep_cfg([*base, "cluster.comm_backend=astra_sim", f"cluster.astra_sim_binary={exe}"])
    dep = build_deployment(cfg)
    lat = dep.instances[0].latency
    assert isinstance(lat, ParallelLatencyModel) and isinstance(lat.network, BinaryBackend)
    h, fp = lat.model.hidden_size, 2
    # the fake reports comm_size + 10 * npu: NPU 1 of the TP pair finishes last
    assert lat.tp_allreduce_ns(7) == 7 * h * fp + 10
    reqs = synthetic(rate=100.0, num_requests=2, input_len=16, output_len=3, seed=0,
                     vocab_size=lat.model.vocab_size)
    simulate_deployment(dep, reqs)
    runs = len(lat.network._cache)
    log.unlink()
    simulate_deployment(build_deployment(cfg), reqs)  # same shapes: no new binary run
    assert not log.exists() and len(lat.network._cache) == runs
    analytical = build_deployment(_sweep_cfg(base)).instances[0].latency
    assert not isinstance(analytical.network, BinaryBackend)  # the default stays analytical


def test_sweep_point_with_a_missing_binary_names_the_key(tmp_path: Path) -> None:
    from sweep.cluster import build_deployment

    cfg = _sweep_cfg(["cluster.comm_backend=astra_sim",
                      f"cluster.astra_sim_binary={tmp_path / 'AstraSim'}"])
    with pytest.raises(ConfigError, match=r"^cluster\.astra_sim_binary=.*no file at"
                       r".*or set cluster\.comm_backend=analytical"):
        build_deployment(cfg)
