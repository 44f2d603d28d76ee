"""One Hydra job run in an actor: what Hydra's ``run_job`` does for a job, at about half its cost.

Hydra 1.3's ``hydra.core.utils.run_job`` prepares a job around the task function:

* it installs the job's config as ``HydraConfig`` (a copy of its ``hydra`` node, read-only,
  whose parent is the job's config so interpolations reach the rest);
* it resolves the job's output directory from ``job_dir_key`` (and ``job_subdir_key``) and
  sets ``hydra.runtime.output_dir`` to its absolute path;
* it gives the task its own copy of the config without ``hydra``;
* it fills a ``JobReturn`` (``cfg``, ``hydra_cfg``, ``overrides``, ``working_dir``);
* it creates the output directory and enters it when ``hydra.job.chdir`` says so;
* it configures logging from ``hydra.job_logging``;
* it writes ``config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` under
  ``hydra.output_subdir`` (unless that is null);
* it runs the task under ``hydra.job.env_set``, between the callbacks' ``on_job_start``
  and ``on_job_end``, catching its exception into the ``JobReturn``;
* it restores the previous ``HydraConfig`` and working directory.

``run_job`` here does the same, observably: the task sees the same config, ``HydraConfig``,
environment, working directory and log files, the callbacks get the same arguments, and the
``JobReturn`` and the three files are the same (checked against Hydra's ``run_job`` in
``tests/hydra_plugins/test_job_run.py``, successful and failing tasks, with and without
``chdir`` and ``output_subdir``). On a ``mem_util_grid`` job (about 235 config nodes, 141 of
them Hydra's), Hydra's ``run_job`` costs 38 ms of the actor's CPU a job around a task that
does nothing, and this one 21 ms (``python benchmarks/job_run.py``), against a bare
``run_point`` of 60-110 ms. The differences (each operation timed on its own, on the 2-core
machine, so they do not add up to the total exactly):

* Hydra installs the config twice, before and after setting the output directory, and each
  install copies the ``hydra`` node (``OmegaConf.masked_copy``, 4.4 ms). Here it is
  installed once, and the output directory is set in the installed copy as in the config.
* Hydra deep-copies the config for the task (``copy.deepcopy``, 8.8 ms); here it is copied
  through OmegaConf's pickling (``compose.copy_config``, 2.7 ms). A config holding a value
  pickling does not take (an object in an ``allow_objects`` config) is deep-copied.
* Hydra deep-copies the installed Hydra config for ``JobReturn.hydra_cfg`` (5.0 ms); the
  copy's ``hydra`` node is parented to the copy, so it resolves no interpolation into the
  rest of the job's config. Here the same copy is made through pickling
  (``detached_copy``). Like Hydra, the job's ``hydra.job.chdir`` and ``env_set`` are read
  from that copy.
* The three files are emitted by libyaml (``yaml.CDumper`` with OmegaConf's representer of
  strings): 13 ms → 5 ms. The bytes are ``OmegaConf.to_yaml``'s for every sweep
  experiment's configs (``tests/hydra_plugins/test_job_run.py``) and for random points of
  short keys and printable text of Unicode's basic plane (``tests/sweep/test_recorder.py``).
  libyaml writes some text in other valid forms: NEL and other control characters and
  characters beyond the basic plane (escapes), empty keys and long keys (``? key`` entries:
  PyYAML's emitter from 123 characters, libyaml above 128 UTF-8 bytes), long double-quoted
  strings (folded elsewhere) and the tags of Python objects (URI-escaped). libyaml's text
  reads back as the values written, for any text (``tests/hydra_plugins/test_job_run.py``);
  PyYAML's does not always (a NEL written raw into a single-quoted scalar reads back as a
  space). Without libyaml
  the files are written by OmegaConf's own dumper. The sweep's recorder writes each
  point's ``config_resolved.yaml`` through the same ``yaml_text``.

Under a ``version_base`` before 1.2 (where an unset ``hydra.job.chdir`` makes Hydra warn
and change directory) a job runs through Hydra's ``run_job`` itself. The project pins
``hydra-core<1.4``, and the tests compare against the installed Hydra's ``run_job``.
"""

from __future__ import annotations

import copy
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hydra import version
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (
    JobReturn,
    JobRuntime,
    JobStatus,
    _check_hydra_context,
    _flush_loggers,
    configure_log,
    env_override,
)
from hydra.core.utils import run_job as hydra_run_job
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf._utils import get_omega_conf_dumper

from hydra_plugins.ray_actor_launcher.compose import copy_config


def _libyaml_dumper() -> type | None:
    """libyaml's dumper with OmegaConf's representer of strings (which quotes a string that
    would read back as a bool or a number), or None where PyYAML was built without libyaml."""
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    dumper = type("OmegaConfCDumper", (yaml.CDumper,), {})
    dumper.add_representer(str, get_omega_conf_dumper().str_representer)
    return dumper


_DUMPER = _libyaml_dumper()


def yaml_text(container: Any) -> str:
    """Plain containers (a config's ``OmegaConf.to_container(..., enum_to_str=True)``) as
    YAML with ``OmegaConf.to_yaml``'s representer and options (keys in order), emitted by
    libyaml where PyYAML has it: ``OmegaConf.to_yaml``'s text but for the forms of some
    text listed in the module's docstring."""
    dumper = get_omega_conf_dumper() if _DUMPER is None else _DUMPER
    text: str = yaml.dump(container, Dumper=dumper, default_flow_style=False,
                          allow_unicode=True, sort_keys=False)
    return text


def config_yaml(cfg: DictConfig | ListConfig) -> str:
    """``OmegaConf.to_yaml(cfg)`` (unresolved, keys in order), emitted by libyaml
    (``yaml_text``)."""
    return yaml_text(OmegaConf.to_container(cfg, resolve=False, enum_to_str=True))


def _write_config(cfg: DictConfig | ListConfig, name: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(config_yaml(cfg), encoding="utf-8")


def _copy(cfg: DictConfig) -> DictConfig:
    """A deep copy of ``cfg`` through OmegaConf's pickling (``compose.copy_config``), or
    ``copy.deepcopy`` for a config holding a value pickling does not take (an object in an
    ``allow_objects`` config), which the deep copy shares."""
    try:
        return copy_config(cfg)
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(cfg)


def detached_copy(installed: DictConfig) -> DictConfig:
    """A copy of ``HydraConfig``'s config (``{"hydra": node}``, the node's parent the job's
    config) whose node's parent is the copy itself, as ``copy.deepcopy`` leaves it (which
    copies each child without its parent link and then re-parents it): interpolations in
    the copy reach only its own ``hydra`` node."""
    node = installed.hydra
    parent = node._get_parent()
    node._set_parent(installed)
    try:
        return _copy(installed)
    finally:
        node._set_parent(parent)


def run_job(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_dir_key: str,
    job_subdir_key: str | None,
    configure_logging: bool = True,
) -> JobReturn:
    """Run ``task_function`` on job ``config`` as Hydra's ``run_job`` does (module doc)."""
    _check_hydra_context(hydra_context)
    if not version.base_at_least("1.2"):  # Hydra's own, with its pre-1.2 chdir default
        return hydra_run_job(hydra_context=hydra_context, task_function=task_function,
                             config=config, job_dir_key=job_dir_key,
                             job_subdir_key=job_subdir_key,
                             configure_logging=configure_logging)
    hydra_config = HydraConfig.instance()
    previous_cfg, previous_cwd = hydra_config.cfg, os.getcwd()
    hydra_config.set_config(config)  # the job's dirs may interpolate ${hydra:...}
    installed = hydra_config.cfg
    assert installed is not None
    output_dir = str(OmegaConf.select(config, job_dir_key))
    if job_subdir_key is not None:
        output_dir = os.path.join(output_dir, str(OmegaConf.select(config, job_subdir_key)))
    for runtime in (config.hydra.runtime, installed.hydra.runtime):
        with read_write(runtime), open_dict(runtime):
            runtime.output_dir = os.path.abspath(output_dir)
    entered = False
    try:
        ret = JobReturn()
        task_cfg = _copy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        ret.cfg = task_cfg
        hydra_cfg = ret.hydra_cfg = detached_copy(installed)
        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        assert isinstance(overrides, list)
        ret.overrides = overrides
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        # read from the detached copy, as Hydra reads them: no interpolation into the job's
        # config, ${hydra:...} from the job's HydraConfig, and unset means no change (1.2 on)
        if hydra_cfg.hydra.job.chdir:
            os.chdir(output_dir)
            entered = True
            ret.working_dir = output_dir
        else:
            ret.working_dir = os.getcwd()
        if configure_logging:
            configure_log(config.hydra.job_logging, config.hydra.verbose)
        if config.hydra.output_subdir is not None:
            folder = Path(config.hydra.runtime.output_dir) / Path(config.hydra.output_subdir)
            _write_config(task_cfg, "config.yaml", folder)
            _write_config(hydra_cfg, "hydra.yaml", folder)
            _write_config(config.hydra.overrides.task, "overrides.yaml", folder)
        _run_task(hydra_context, task_function, config, task_cfg, hydra_cfg, ret)
        ret.task_name = JobRuntime.instance().get("name")
        _flush_loggers()
        hydra_context.callbacks.on_job_end(config=config, job_return=ret)
        return ret
    finally:
        hydra_config.cfg = previous_cfg
        if entered:
            os.chdir(previous_cwd)


def _run_task(hydra_context: HydraContext, task_function: Callable[[DictConfig], Any],
              config: DictConfig, task_cfg: DictConfig, hydra_cfg: DictConfig,
              ret: JobReturn) -> None:
    """The task under ``hydra.job.env_set`` (of the detached ``hydra_cfg``), after the
    callbacks' ``on_job_start``; its result or its exception into ``ret``."""
    with env_override(hydra_cfg.hydra.job.env_set):
        hydra_context.callbacks.on_job_start(config=config, task_function=task_function)
        try:
            ret.return_value = task_function(task_cfg)
            ret.status = JobStatus.COMPLETED
        except Exception as err:  # the job's failure is its result, as in Hydra
            ret.return_value = err
            ret.status = JobStatus.FAILED
