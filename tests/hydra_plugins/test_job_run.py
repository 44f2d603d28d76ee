"""``job_run.run_job`` does for a job what Hydra's own ``run_job`` does: the task sees the
same config, ``HydraConfig``, environment and working directory, the callbacks get the same
arguments, the ``JobReturn`` and the files are the same, and the process is left as Hydra
leaves it. Each case runs the installed Hydra's ``run_job`` and then ours, into the same
output directory, and compares everything either leaves behind."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import version
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.core.utils import run_job as hydra_run_job
from hydra.types import HydraContext, RunMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydra_plugins.ray_actor_launcher import job_run
from sweep.schema import register

register()
pytestmark = pytest.mark.usefixtures("hydra_conf")
ENV_KEY = "SERVESWEEP_JOB_RUN_PROBE"


class Probe:
    """Callbacks and a task that note what they see."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[Any] = []

    def on_job_start(self, config: DictConfig, task_function: Any, **kw: Any) -> None:
        self.seen.append(("start", OmegaConf.to_yaml(config), task_function is self.task))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kw: Any) -> None:
        self.seen.append(("end", OmegaConf.to_yaml(config), job_return.status))

    def task(self, cfg: DictConfig) -> dict[str, Any]:
        hydra_cfg = HydraConfig.get()
        root = logging.getLogger()
        self.seen.append(("task", OmegaConf.to_yaml(cfg), os.getcwd(),
                          OmegaConf.to_yaml(hydra_cfg),
                          OmegaConf.to_container(hydra_cfg, resolve=True),
                          os.environ.get(ENV_KEY),
                          sorted(getattr(h, "baseFilename", type(h).__name__)
                                 for h in root.handlers)))
        if self.fail:
            raise ValueError("the task failed")
        return {"rate": float(cfg.workload.rate)}


def _job(tmp_path: Path, *overrides: str, subdir: str | None = None) -> DictConfig:
    """Job 3 of a sweep into ``tmp_path``, composed and numbered as the launcher does."""
    loader = GlobalHydra.instance().config_loader()
    master = loader.load_configuration(
        "config", ["+experiment=mem_util_grid", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        RunMode.MULTIRUN)
    OmegaConf.select(master, "hydra.run.dir")  # ${now:} resolved once, cached for every copy
    cfg = loader.load_sweep_config(master, ["workload.rate=3", *overrides])
    with open_dict(cfg):
        cfg.hydra.job.num = 3
        cfg.hydra.job.id = "sweep_3"
        if subdir is not None:
            with read_write(cfg.hydra.sweep):
                cfg.hydra.sweep.subdir = subdir
    return cfg


def _resolved(cfg: DictConfig) -> Any:
    """``cfg`` with its interpolations resolved, or the error resolving them gives."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # compared: Hydra's JobReturn.hydra_cfg resolves only its own
        return type(err).__name__, str(err)


def _run(fn: Any, cfg: DictConfig, fail: bool, configure_logging: bool = True) -> dict:
    """Everything a run of ``fn`` shows: the JobReturn, the callbacks' and the task's view,
    the files, and the process's state after."""
    probe = Probe(fail)
    context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                           callbacks=probe)  # type: ignore[arg-type]
    before = HydraConfig.instance().cfg
    cwd = os.getcwd()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ret = fn(hydra_context=context, task_function=probe.task, config=cfg,
                 job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
                 configure_logging=configure_logging)
    out = Path(cfg.hydra.sweep.dir)
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file() and p.suffix != ".log"}
    logs = sorted(str(p.relative_to(out)) for p in out.rglob("*.log"))
    shutil.rmtree(out)
    value = ret._return_value
    return {
        "status": ret.status,
        "value": (type(value).__name__, str(value)) if isinstance(value, Exception) else value,
        "cfg": OmegaConf.to_yaml(ret.cfg),
        "cfg_flags": (OmegaConf.is_struct(ret.cfg), OmegaConf.is_readonly(ret.cfg)),
        "hydra_cfg": OmegaConf.to_yaml(ret.hydra_cfg),
        "hydra_resolved": _resolved(ret.hydra_cfg),
        "hydra_flags": OmegaConf.is_readonly(ret.hydra_cfg.hydra),
        "hydra_parent": OmegaConf.to_yaml(ret.hydra_cfg.hydra._get_parent()),
        "overrides": ret.overrides,
        "working_dir": ret.working_dir,
        "task_name": ret.task_name,
        "seen": probe.seen,
        "files": files,
        "logs": logs,
        "warnings": [(w.category.__name__, str(w.message)) for w in caught],
        "config_after": OmegaConf.to_yaml(cfg),
        "restored": HydraConfig.instance().cfg is before and os.getcwd() == cwd,
    }


def _compare(cfg_of: Any, fail: bool = False, configure_logging: bool = True) -> dict:
    cfg = cfg_of()  # once: its ${now:} dirs resolve to the same time for both
    hydra = _run(hydra_run_job, copy.deepcopy(cfg), fail, configure_logging)
    ours = _run(job_run.run_job, copy.deepcopy(cfg), fail, configure_logging)
    assert ours.keys() == hydra.keys()
    for key in hydra:
        if key == "seen":  # element by element, for a readable failure
            for mine, theirs in zip(ours[key], hydra[key], strict=True):
                for part, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                    assert a == b, (mine[0], part)
        assert ours[key] == hydra[key], key
    return ours


def test_a_job_runs_as_with_hydra(tmp_path) -> None:
    seen = _compare(lambda: _job(tmp_path))
    assert seen["status"] == JobStatus.COMPLETED and seen["value"] == {"rate": 3.0}
    assert set(seen["files"]) == {"3/.hydra/config.yaml", "3/.hydra/hydra.yaml",
                                  "3/.hydra/overrides.yaml"}
    assert seen["logs"] == ["3/sweep.log"] and seen["restored"]
    assert [s[0] for s in seen["seen"]] == ["start", "task", "end"]


def test_a_failing_task_is_returned_as_with_hydra(tmp_path) -> None:
    seen = _compare(lambda: _job(tmp_path), fail=True)
    assert seen["status"] == JobStatus.FAILED
    assert seen["value"] == ("ValueError", "the task failed")


def test_changing_directory_as_with_hydra(tmp_path) -> None:
    seen = _compare(lambda: _job(tmp_path, "hydra.job.chdir=true"))
    assert seen["working_dir"] == str(tmp_path / "sweep" / "3") and seen["restored"]


def test_no_config_files_and_no_logging_as_with_hydra(tmp_path) -> None:
    seen = _compare(lambda: _job(tmp_path, "hydra.output_subdir=null"), configure_logging=False)
    assert seen["files"] == {}


def test_environment_and_hydra_interpolations_as_with_hydra(tmp_path) -> None:
    seen = _compare(lambda: _job(tmp_path, f"+hydra.job.env_set.{ENV_KEY}=on",
                                 subdir="job_${hydra:job.num}"))
    assert seen["seen"][1][5] == "on" and ENV_KEY not in os.environ
    assert "job_3/.hydra/config.yaml" in seen["files"]


def test_the_pre_1_2_working_directory_default_is_hydras(tmp_path) -> None:
    """``chdir`` unset under ``version_base`` 1.1: Hydra warns and enters the directory."""
    base = version.getbase()
    with warnings.catch_warnings():  # Hydra's notice that 1.1 behaviour is going away
        warnings.simplefilter("ignore")
        version.setbase("1.1")
    try:
        seen = _compare(lambda: _job(tmp_path, "hydra.job.chdir=null"))
    finally:
        version.VersionBase.instance().setbase(base)
    assert seen["working_dir"] == str(tmp_path / "sweep" / "3")
    assert any("working directory" in text for _, text in seen["warnings"])


@pytest.mark.parametrize("experiment", sorted(  # the sweeps (`python -m sweep ... -m`); the
    p.stem for p in (Path(__file__).parents[2] / "conf" / "experiment").glob("*.yaml")
    if "python -m sweep " in p.read_text()))  # capacity studies run no launcher jobs
def test_the_files_have_omegaconfs_bytes(experiment) -> None:
    """Every sweep experiment's job config and Hydra config, emitted by libyaml, is byte for
    byte ``OmegaConf.to_yaml``'s."""
    loader = GlobalHydra.instance().config_loader()
    cfg = loader.load_configuration("config", [f"+experiment={experiment}"], RunMode.MULTIRUN)
    HydraConfig.instance().set_config(cfg)
    for part in (cfg, HydraConfig.get(), cfg.hydra.overrides.task, cfg.hydra.job_logging):
        assert job_run.config_yaml(part) == OmegaConf.to_yaml(part)


_TEXT = st.text(st.characters(codec="utf-8"))
_LEAF = st.one_of(_TEXT, st.integers(), st.floats(allow_nan=False), st.booleans(), st.none())
_KEY = st.text(st.characters(codec="utf-8"), min_size=1)
_TREE = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEY, inner, max_size=4)), max_leaves=16)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(_KEY, _TREE, min_size=1, max_size=5))
def test_any_text_reads_back_as_written(tree: dict) -> None:
    """libyaml's text reads back as the same values, for any text in keys and values
    (PyYAML's emitter's does not always: it writes NEL raw into a single-quoted scalar)."""
    assert yaml.safe_load(job_run.yaml_text(tree)) == tree
