"""``JobComposer`` gives every job exactly the config ``load_sweep_config`` composes: the
same values, interpolations, flags, bookkeeping and errors, for group switches, additions,
deletions, bad values and hydra overrides, with one composition per config choice."""

from __future__ import annotations

import copy
import random

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.ray_actor_launcher.compose import JobComposer, copy_config
from sweep.schema import register

register()
pytestmark = pytest.mark.usefixtures("hydra_conf")


def _master(*overrides: str) -> DictConfig:
    """The sweep's config as Hydra composes it; its ``${now:}`` dirs resolved (so cached and
    copied into every job, as the sweeper's resolving the sweep dir does in a real sweep)."""
    loader = GlobalHydra.instance().config_loader()
    master = loader.load_configuration("config", list(overrides), RunMode.MULTIRUN)
    OmegaConf.select(master, "hydra.run.dir")
    OmegaConf.select(master, "hydra.sweep.dir")
    return master


def _outcome(fn):
    """The composed config, or the error it raises (type and text, causes included)."""
    try:
        return fn()
    except Exception as err:  # compared below
        chain = []
        while err is not None:
            chain.append((type(err).__name__, str(err)))
            err = err.__cause__
        return chain


def _resolved(cfg: DictConfig) -> dict:
    """Every value resolved, as a job sees it (with its number set, as the launcher does)."""
    job = copy.deepcopy(cfg)
    job.hydra.job.num = 3
    job.hydra.job.id = "3"
    job.hydra.runtime.output_dir = "out/3"
    out = OmegaConf.to_container(job, resolve=True)
    assert isinstance(out, dict)
    return out


def _flags(cfg: DictConfig) -> list:
    return [OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg),
            OmegaConf.is_struct(cfg.hydra), OmegaConf.is_readonly(cfg.hydra)]


def assert_same(fast, hydra) -> None:
    """Both errors with the same chain, or both configs equal in every respect we can see."""
    assert isinstance(fast, DictConfig) == isinstance(hydra, DictConfig), (fast, hydra)
    if not isinstance(hydra, DictConfig):
        assert fast == hydra
        return
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(hydra)  # unresolved: interpolations too
    assert _resolved(fast) == _resolved(hydra)
    assert _flags(fast) == _flags(hydra)
    assert OmegaConf.get_type(fast.cluster) is OmegaConf.get_type(hydra.cluster)


def _check(master: DictConfig, jobs: list[list[str]], composer: JobComposer | None = None,
           ) -> JobComposer:
    loader = GlobalHydra.instance().config_loader()
    composer = composer or JobComposer(loader, master)
    for job in jobs:
        fast = _outcome(lambda job=job: composer.compose(job))
        hydra = _outcome(lambda job=job: loader.load_sweep_config(master, list(job)))
        assert_same(fast, hydra)
    return composer


def test_a_value_grid_is_composed_once():
    master = _master("+experiment=mem_util_grid")
    jobs = [["+experiment=mem_util_grid", f"cluster.gpu_memory_utilization={u}",
             f"workload.rate={r}"] for u in (0.5, 0.7, 0.9) for r in (1, 4)]
    composer = _check(master, jobs)
    assert composer.full_compositions == 1


def test_group_switches_compose_once_per_choice():
    master = _master("hydra.launcher.num_actors=2")
    jobs = [[f"hardware={hw}", f"workload.rate={r}", f"model={m}"]
            for hw in ("h100_sxm", "a100_80g") for r in (1, 2) for m in ("llama3_8b", "qwen3_32b")]
    composer = _check(master, jobs)
    assert composer.full_compositions == 4


@pytest.mark.parametrize("job", [
    ["+experiment=mem_util_grid", "hardware=h100_sxm", "workload.num_requests=500"],
    ["cluster=tp2", "cluster.max_num_seqs=64", "model=qwen3_32b"],
    ["workload.rate=3", "workload=staged", "workload.stages=[{rate:2,duration_s:5}]"],
    ["++workload.rate=3", "study.name=renamed"],           # force-add; an interpolated name
    ["workload.rate=2", "workload.rate=5"],                 # the last one wins, as in Hydra
    ["~groundtruth.dir"],                                   # deletion of a value
    ["+study.extra=1"],                                     # addition to a typed node
    ["cluster.no_such_key=1", "hardware=h200"],             # unknown key: Hydra's message
    ["cluster.block_size=abc"],                             # bad type: Hydra's message
    ["hardware=no_such_gpu", "workload.rate=2"],            # unknown group option
    ["+hardware=h200"],                                     # force-add of a group
    ["~hardware", "workload.rate=2"],                       # group deletion
    ["hardware={name:x}"],                                  # a dict on a group key: a value
    ["tracking.uri=null", "slo.bounds.ttft_ms_p99=500"],
])
def test_each_kind_of_override_as_hydra_composes_it(job):
    _check(_master("+experiment=mem_util_grid", "hydra.job.chdir=false"), [job])


def test_hydra_settings_of_the_sweep_and_the_dirname_follow_the_overrides():
    master = _master("hydra.job.config.override_dirname.kv_sep=_",
                     "hydra.job.config.override_dirname.exclude_keys=[workload.rate]")
    jobs = [["workload.rate=2", "cluster.max_num_seqs=32"], ["workload.rate=3", "hardware=h200"]]
    _check(master, jobs)


GROUPS = {"hardware": ["h100_sxm", "a100_80g", "l40s"], "model": ["llama3_8b", "qwen3_32b"],
          "cluster": ["single", "tp2"]}
VALUES = {"workload.rate": st.sampled_from(["1", "2.5", "inf", "x"]),
          "cluster.gpu_memory_utilization": st.sampled_from(["0.5", "0.9", "1.5"]),
          "workload.num_requests": st.sampled_from(["10", "300"]),
          "cluster.max_num_seqs": st.sampled_from(["16", "256"])}


@pytest.fixture(scope="module")
def shared(hydra_conf) -> tuple[DictConfig, JobComposer]:
    """One sweep config and one composer for every example, so the cache is shared."""
    master = _master("+experiment=mem_util_grid")
    return master, JobComposer(GlobalHydra.instance().config_loader(), master)


@st.composite
def job_overrides(draw) -> list[str]:
    items = [f"{g}={draw(st.sampled_from(opts))}" for g, opts in GROUPS.items()
             if draw(st.booleans())]
    items += [f"{k}={draw(v)}" for k, v in VALUES.items() if draw(st.booleans())]
    random.Random(draw(st.integers(0, 1000))).shuffle(items)
    return items


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(job_overrides(), min_size=1, max_size=3))
def test_any_mix_of_switches_and_values_matches_hydra(shared, jobs):
    _check(shared[0], jobs, shared[1])


def _nodes(cfg):
    """Every node below ``cfg`` by key path: its type, whether its parent link points at the
    node above it in this tree, its flags and typing metadata."""
    out = {}

    def walk(node, path, parent):
        meta = node._metadata
        out[path] = (type(node).__name__, node._get_parent() is parent, meta.flags,
                     meta.ref_type, meta.object_type, meta.optional, meta.key)
        if OmegaConf.is_dict(node):
            for key in node:
                walk(node._get_node(key), f"{path}.{key}", node)
        elif OmegaConf.is_list(node):
            for i in range(len(node)):
                walk(node._get_node(i), f"{path}[{i}]", node)

    walk(cfg, "", None)
    return out


def test_copy_config_is_a_deep_copy():
    """``copy_config`` gives what ``copy.deepcopy`` gives: the same values unresolved and
    resolved, node types, flags, typing metadata and parent links; and a copy that shares
    nothing with the original."""
    master = _master("+experiment=mem_util_grid")
    job = GlobalHydra.instance().config_loader().load_sweep_config(master, ["workload.rate=3"])
    OmegaConf.set_readonly(job.study, True)  # a flag set below the root
    fast, slow = copy_config(job), copy.deepcopy(job)
    assert_same(fast, slow)
    assert _nodes(fast) == _nodes(slow)
    assert all(linked for _, linked, *_ in _nodes(fast).values())
    fast.workload.rate = 7  # the copy is its own
    assert job.workload.rate == 3 and slow.workload.rate == 3
    assert OmegaConf.is_readonly(fast.study) and not OmegaConf.is_readonly(fast.cluster)
