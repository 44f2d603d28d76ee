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

    def __init__(self, fail: bool = False, fail_start: bool = False) -> None:
        self.fail, self.fail_start = fail, fail_start
        self.seen: list[Any] = []

    def on_job_start(self, config: DictConfig, task_function: Any, **kw: Any) -> None:
        self.seen.append(("start", OmegaConf.to_yaml(config), task_function is self.task,
                          OmegaConf.to_yaml(HydraConfig.get())))
        if self.fail_start:
            raise RuntimeError("a callback failed")

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


def _run(fn: Any, cfg: DictConfig, fail: bool, configure_logging: bool = True,
         fail_start: bool = False) -> dict:
    """Everything a run of ``fn`` shows: the JobReturn (or the error it raised), the
    callbacks' and the task's view, the files, and the process's state after."""
    probe = Probe(fail, fail_start)
    context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                           callbacks=probe)  # type: ignore[arg-type]
    before = HydraConfig.instance().cfg
    cwd = os.getcwd()
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ret = fn(hydra_context=context, task_function=probe.task, config=cfg,
                     job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
                     configure_logging=configure_logging)
        except Exception as err:  # compared: both raise the same, leaving the same state
            raised, ret = (type(err).__name__, str(err)), None
    state = {"raised": raised, "seen": probe.seen,
             "restored": HydraConfig.instance().cfg is before and os.getcwd() == cwd}
    out = Path(cfg.hydra.sweep.dir)
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file() and p.suffix != ".log"}
    logs = sorted(str(p.relative_to(out)) for p in out.rglob("*.log"))
    shutil.rmtree(out, ignore_errors=True)
    state.update(files=files, logs=logs)
    if ret is None:
        return state
    value = ret._return_value
    return state | {
        "status": ret.status,
        "value": (type(value).__name__, str(value)) if isinstance(value, Exception) else value,
        "cfg": OmegaConf.to_yaml(ret.cfg),
        "cfg_flags": (OmegaConf.is_struct(ret.cfg), OmegaConf.is_readonly(ret.cfg)),
        "hydra_cfg": OmegaConf.to_yaml(ret.hydra_cfg),
        "hydra_resolved": _resolved(ret.hydra_cfg),
        "hydra_flags": OmegaConf.is_readonly(ret.hydra_cfg.hydra),
        "hydra_parent": OmegaConf.to_yaml(ret.hydra_cfg.hydra._get_parent()),
        "hydra_parent_is_root": ret.hydra_cfg.hydra._get_parent() is ret.hydra_cfg,
        "overrides": ret.overrides,
        "working_dir": ret.working_dir,
        "task_name": ret.task_name,
        "warnings": [(w.category.__name__, str(w.message)) for w in caught],
        "config_after": OmegaConf.to_yaml(cfg),
    }


def _compare(cfg_of: Any, fail: bool = False, configure_logging: bool = True,
             fail_start: bool = False) -> dict:
    cfg = cfg_of()  # once: its ${now:} dirs resolve to the same time for both
    hydra = _run(hydra_run_job, copy.deepcopy(cfg), fail, configure_logging, fail_start)
    ours = _run(job_run.run_job, copy.deepcopy(cfg), fail, configure_logging, fail_start)
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


def test_environment_and_chdir_read_as_hydra_reads_them(tmp_path) -> None:
    """``env_set`` and ``chdir`` come from the Hydra config's own copy: ``${hydra:}`` and
    references inside ``hydra`` resolve, references into the job's config do not."""
    seen = _compare(lambda: _job(tmp_path, f"+hydra.job.env_set.{ENV_KEY}=${{hydra.job.name}}",
                                 "hydra.job.chdir=${hydra:job.num}"))
    assert seen["seen"][1][5] == "sweep" and seen["working_dir"].endswith("3")
    seen = _compare(lambda: _job(tmp_path, f"+hydra.job.env_set.{ENV_KEY}=${{workload.rate}}"))
    assert seen["raised"][0] == "InterpolationKeyError" and seen["restored"]


def test_a_failing_callback_as_with_hydra(tmp_path) -> None:
    seen = _compare(lambda: _job(tmp_path, "hydra.job.chdir=true"), fail_start=True)
    assert seen["raised"] == ("RuntimeError", "a callback failed") and seen["restored"]


def test_an_unpicklable_value_is_deep_copied_as_with_hydra(tmp_path) -> None:
    """A value pickling does not take (an object in an ``allow_objects`` config). No config
    files: libyaml writes the object's tag URI-escaped (``%3Clambda%3E``)."""
    def with_object() -> DictConfig:
        cfg = _job(tmp_path, "hydra.output_subdir=null")
        cfg._set_flag("allow_objects", True)
        with open_dict(cfg):
            cfg.handle = lambda: None
        return cfg

    seen = _compare(with_object)
    assert seen["status"] == JobStatus.COMPLETED


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


ACTOR_FIRST_JOB = r"""
import pickle, sys
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.singleton import Singleton
from hydra.types import RunMode
from hydra_plugins.ray_actor_launcher._actor import pickle_config
from hydra_plugins.ray_actor_launcher.compose import copy_config
from sweep.schema import register
register()
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    loader = GlobalHydra.instance().config_loader()
    blob = pickle_config(loader.load_configuration("config", ["+experiment=mem_util_grid"],
                                                   RunMode.MULTIRUN))
    state = Singleton.get_state()
early = pickle.loads(blob)  # as Ray unpickles a call's arguments
Singleton.set_state(state)  # the actor's first job: Hydra's plugins scanned again
try:
    copy_config(early)
    print("early: copied")
except pickle.PicklingError:
    print("early: PicklingError")
copy_config(pickle.loads(blob))  # the actor's way: unpickled after the state
print("late: copied")
"""


def test_a_config_unpickled_after_hydras_state_copies() -> None:
    """Why the actor unpickles a job's config itself, after ``Singleton.set_state``: the
    plugin scan that installing the state runs redefines the plugins' classes, and a config
    unpickled before it no longer pickles (in a fresh process, as an actor's first job)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", ACTOR_FIRST_JOB, str(repo / "conf")],
                          cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["early: PicklingError", "late: copied"]
