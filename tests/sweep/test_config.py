"""Config tree and validation of the sweep app (no Ray, no simulation)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from engine.specs import ConfigError
from profiles.catalog import list_hardware, list_models
from sweep.schema import register
from sweep.validate import check_config

CONF = Path(__file__).resolve().parents[2] / "conf"
register()
pytestmark = pytest.mark.usefixtures("hydra_conf")




def compose_cfg(*overrides: str, hydra: bool = False):
    return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_default_config_is_valid_and_needs_no_data_files():
    cfg = compose_cfg()
    check_config(cfg)
    assert cfg.hardware.bundle.source == "roofline"
    assert cfg.workload.kind == "synthetic"
    assert cfg.cluster.gpu_memory_utilization == 0.9


def test_default_launcher_and_tracking_settings():
    cfg = compose_cfg(hydra=True)
    assert cfg.hydra.launcher._target_.endswith("RayActorLauncher")
    assert cfg.hydra.launcher.validator == "sweep.preflight:preflight"
    assert cfg.hydra.launcher.recorder == "sweep.recorder:SweepRecorder"
    assert cfg.hydra.sweeper._target_.endswith("GridSweeper")
    assert cfg.hydra.job.name == "sweep"
    assert cfg.tracking.experiment == "default"
    assert cfg.tracking.timeseries_steps == 320  # what MLflow's run charts draw


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "hardware").glob("*.yaml")))
def test_every_hardware_option_names_a_catalog_entry(name):
    cfg = compose_cfg(f"hardware={name}")
    assert cfg.hardware.name in list_hardware()


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_every_model_option_names_a_catalog_entry(name):
    cfg = compose_cfg(f"model={name}")
    assert cfg.model.name in list_models()
    check_config(cfg)


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "cluster").glob("*.yaml")))
def test_every_cluster_option_validates(name):
    # A MoE model fits every shape (EP needs one); dense models are covered by the studies.
    check_config(compose_cfg(f"cluster={name}", "model=qwen3_30b_a3b"))


def test_expert_parallel_cluster_on_a_dense_model_is_refused_by_name():
    with pytest.raises(ConfigError, match="cluster.expert_parallel_size"):
        check_config(compose_cfg("cluster=dp2_ep2", "model=llama3_8b"))


def test_basic_launcher_can_replace_the_ray_launcher():
    cfg = compose_cfg("hydra/launcher=basic", hydra=True)
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")


def test_issue_hardware_and_models_are_shipped():
    shipped = {compose_cfg(f"hardware={p.stem}").hardware.name
               for p in (CONF / "hardware").glob("*.yaml")}
    assert {"H100-SXM", "H200", "A100-80G", "B200", "L40S", "RTXPRO6000", "RTX4090"} <= shipped


# The studies of `python -m sweep ... -m` (other entry points keep their own files here).
STUDIES = ("mem_util_grid", "prefix_caching", "hardware_cost", "tp_scaling", "batch_knobs",
           "groundtruth_llama8b")


def test_every_study_is_shipped():
    assert {p.stem for p in (CONF / "experiment").glob("*.yaml")} >= set(STUDIES)


@pytest.mark.parametrize("name", STUDIES)
def test_experiments_compose_with_sweep_params_and_valid_points(name):
    cfg = compose_cfg(f"+experiment={name}", hydra=True)
    if cfg.groundtruth.dir and not Path(cfg.groundtruth.dir).is_dir():
        pytest.skip(f"{name} needs the reference data (set SERVESWEEP_DATA)")
    params = cfg.hydra.sweeper.params
    assert len(params) >= 1, "a study sweeps at least one key"
    assert cfg.study.name == name
    assert cfg.tracking.experiment == name
    # the grid's corner points must pass validation (first and last value of every key)
    keys = list(params)
    values = [sorted({v[0], v[-1]}) for v in (str(params[k]).split(",") for k in keys)]
    for combo in itertools.product(*values):
        point = compose_cfg(f"+experiment={name}", *(f"{k}={v}" for k, v in zip(keys, combo, strict=True)))
        check_config(point)


def test_mem_util_grid_shape():
    cfg = compose_cfg("+experiment=mem_util_grid", hydra=True)
    utils = str(cfg.hydra.sweeper.params["cluster.gpu_memory_utilization"]).split(",")
    rates = str(cfg.hydra.sweeper.params["workload.rate"]).split(",")
    assert len(utils) >= 3 and len(rates) >= 3
    assert cfg.study.plot.line == "cluster.gpu_memory_utilization"


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("hardware.name=TPU-v9", "hardware.name", "H100-SXM"),
        ("model.name=gpt-5", "model.name", "meta-llama/Llama-3.1-8B"),
        ("cluster.tensor_parallel_size=3", "cluster.tensor_parallel_size", "[1, 2, 4, 8, 16, 32]"),
        ("workload.rate=-2", "workload.rate", "> 0"),
        ("cluster.gpu_memory_utilization=0", "cluster.gpu_memory_utilization", "0 < value <= 1"),
        ("cluster.gpu_memory_utilization=1.2", "cluster.gpu_memory_utilization", "0 < value <= 1"),
        ("cluster.kv_cache_dtype=int3", "cluster.kv_cache_dtype", "fp8"),
        ("cluster.max_num_batched_tokens=16", "cluster.max_num_batched_tokens", ">= cluster.max_num_seqs"),
        ("cluster.block_size=7", "cluster.block_size", "[1, 8, 16, 32, 64, 128, 256]"),
        ("cluster.num_gpu_blocks_override=1", "cluster.num_gpu_blocks_override", "from 2"),
        ("cluster.num_gpu_blocks_override=1073741824", "cluster.num_gpu_blocks_override",
         "to 1073741823"),
        ("cluster.max_model_len=1000000", "cluster.max_model_len", "1..131072"),
        ("cluster.gpu_memory_utilization=90", "cluster.gpu_memory_utilization", "did you mean 0.90"),
        ("hardware.bundle.source=magic", "hardware.bundle.source", "roofline"),
        ("workload.kind=replay", "workload.kind", "trace"),
        ("workload.arrival=uniform", "workload.arrival", "gamma"),
        ("workload.input_len=zipf", "workload.input_len", "sharegpt"),
        ("workload.duration_s=30", "workload.duration_s", "exactly one"),
        ("slo.bounds.ttft_ms_p99=-1", "slo.bounds.ttft_ms_p99", "> 0"),
        ("slo.bounds.ttft_ms_p99=nan", "slo.bounds.ttft_ms_p99", "> 0"),
        ("+slo.bounds.ttft_p99=5", "slo.bounds.ttft_p99", "<metric>_ms_<stat>"),
        ("slo.goodput.tpot_ms=0", "slo.goodput.tpot_ms", "> 0"),
        ("workload.rate=nan", "workload.rate", "> 0"),
        ("workload.cv=inf", "workload.cv", "finite"),
        ("hardware.cost_per_hour=nan", "hardware.cost_per_hour", ">= 0"),
        ("workload.seed=-1", "workload.seed", "0..4294967295"),
        ("workload.seed=4294967296", "workload.seed", "0..4294967295"),
        ("tracking.timeseries_steps=0", "tracking.timeseries_steps", "null (every second)"),
    ],
)
def test_bad_values_name_the_key_and_allowed_values(override, key, allowed):
    cfg = compose_cfg(override)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert str(err.value).startswith(f"{key}=")
    assert allowed in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster.num_instances=2"],
        ["cluster.pipeline_parallel_size=2"],
        ["cluster.data_parallel_size=2"],
        ["cluster.router=prefix_aware"],
        ["cluster.num_instances=3", "cluster.pd_disaggregation=true",
         "cluster.num_prefill_instances=1"],
        ["cluster.prefix_storage=cpu"],
        ["cluster=tp2_x2"],
        ["model=qwen3_30b_a3b", "cluster.data_parallel_size=2", "cluster.expert_parallel_size=2"],
    ],
)
def test_cluster_shapes_validate(overrides):
    check_config(compose_cfg(*overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.expert_parallel_size=2"], "dense model"),
        (["cluster.router=fastest"], "cluster.router='fastest' is not allowed"),
        (["cluster.pd_disaggregation=true"], "cluster.num_prefill_instances=0"),
        (["cluster.num_prefill_instances=1"], "needs cluster.pd_disaggregation=true"),
        (["cluster.prefix_storage=disk"], "allowed: none, cpu, cxl"),
        (["cluster.prefix_storage=cpu", "cluster.enable_prefix_caching=false"],
         "needs cluster.enable_prefix_caching=true"),
        (["model=qwen3_30b_a3b", "cluster.data_parallel_size=2", "cluster.expert_parallel_size=4"],
         "tensor_parallel_size × data_parallel_size = 2"),
    ],
)
def test_bad_cluster_shapes_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_config(compose_cfg(*overrides))


def test_cluster_engine_settings_are_engine_configs_with_its_defaults():
    # one definition: the cluster schema's engine keys and defaults are EngineConfig's own
    from dataclasses import fields

    from engine.specs import EngineConfig
    from sweep.schema import CLUSTER_ENGINE_KEYS, NOT_CLUSTER_KEYS, ClusterConf
    from sweep.settings import engine_config

    engine = {f.name: f for f in fields(EngineConfig)}
    schema = {f.name: f for f in fields(ClusterConf)}
    assert set(CLUSTER_ENGINE_KEYS) == set(engine) - set(NOT_CLUSTER_KEYS)
    for key in CLUSTER_ENGINE_KEYS:
        assert schema[key].default == engine[key].default, key
    assert engine_config(compose_cfg().cluster) == EngineConfig()
    cfg = compose_cfg("cluster=tp2", "cluster.block_size=32", "cluster.max_num_seqs=64")
    assert engine_config(cfg.cluster) == EngineConfig(tensor_parallel_size=2, block_size=32,
                                                      max_num_seqs=64)


@pytest.mark.parametrize("path", sorted((CONF / "cluster").glob("*.yaml")), ids=lambda p: p.stem)
def test_cluster_files_set_only_what_differs_from_the_schema(path):
    from sweep.schema import ClusterConf

    defaults = OmegaConf.structured(ClusterConf)
    data = OmegaConf.to_container(OmegaConf.load(path)) or {}
    assert "defaults" not in data
    for key, value in data.items():
        assert key in defaults and defaults[key] != value, f"{path.name}: {key}: {value}"


def test_schema_rejects_unknown_keys_and_bad_types_at_composition():
    with pytest.raises(ConfigCompositionException, match="gpu_mem_util"):
        compose_cfg("cluster.gpu_mem_util=0.5")
    with pytest.raises(ConfigCompositionException, match="cluster.max_num_seqs"):
        compose_cfg("cluster.max_num_seqs=many")
    for bad in ("2.5", "true"):
        with pytest.raises(ConfigCompositionException, match="tracking.timeseries_steps"):
            compose_cfg(f"tracking.timeseries_steps={bad}")


def test_measured_bundle_dir_must_exist(tmp_path):
    cfg = compose_cfg("hardware=rtxpro6000_measured", f"hardware.bundle.root={tmp_path / 'nope'}")
    with pytest.raises(ConfigError, match="hardware.bundle.root"):
        check_config(cfg)


def test_trace_workload_path_must_exist(tmp_path):
    cfg = compose_cfg("workload=trace", f"workload.path={tmp_path / 'missing.jsonl'}")
    with pytest.raises(ConfigError, match="workload.path"):
        check_config(cfg)


def test_resolved_config_is_plain_yaml():
    cfg = compose_cfg("+experiment=prefix_caching")
    text = OmegaConf.to_yaml(cfg, resolve=True)
    assert "enable_prefix_caching" in text and "${" not in text
