"""The job configs of a sweep as Hydra composes them, with one composition per config choice.

Hydra's launchers compose every job from its files (``ConfigLoader.load_sweep_config``):
parse the overrides, build the defaults list, load and merge every config file, then apply
the overrides that set values. That costs 0.15 CPU-s per job on a small machine (0.35 s with
the actors busy beside it), most of a grid point's driver time. The value overrides act on
the merged config only, as the last step (``ConfigLoaderImpl._load_configuration_impl``
applies ``defaults_list.config_overrides`` after ``_compose_config_from_defaults_list``), and
the defaults list and the files do not depend on them. In a grid most jobs differ only in
values (``workload.rate=2``), so ``JobComposer``

* splits each job's overrides with Hydra's own classification (``defaults_list.Overrides``,
  on a repository with the job's search path, as ``create_defaults_list`` does): those that
  choose configs (group switches such as ``hardware=h100_sxm``, ``+experiment=...``, group
  deletions) and every ``hydra.*`` override form the job's *choice*; the rest set values;
* composes each distinct choice once, with ``load_sweep_config`` itself;
* gives every job a copy of its choice's config with its value overrides applied by Hydra's
  ``_apply_overrides_to_config``, and the two entries Hydra derives from the whole override
  list set from the job's list as Hydra sets them: ``hydra.overrides.task`` (every non-hydra
  override, in order) and ``hydra.job.override_dirname`` (``get_overrides_dirname``); the
  resolver cache is copied from the sweep's config, as ``load_sweep_config`` does.

The result equals ``load_sweep_config(master, overrides)`` for every job, values, flags and
errors included (checked job for job against it in ``tests/hydra_plugins/test_compose.py``,
on group switches, additions, deletions and bad values). This leans on two private parts of
Hydra 1.3 (``_parse_overrides_and_create_caching_repo``, ``_apply_overrides_to_config``);
the project pins ``hydra-core<1.4`` and the test fails if they change.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.config_repository import CachingConfigRepository
from hydra._internal.defaults_list import Overrides
from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

PROTOCOL = pickle.HIGHEST_PROTOCOL  # of the pickled configs (copy_config, JobComposer, _actor)


class JobComposer:
    """``compose(overrides)`` = ``config_loader.load_sweep_config(master, overrides)``, with
    one full composition per distinct config choice (``full_compositions`` counts them)."""

    def __init__(self, config_loader: ConfigLoader, master: DictConfig) -> None:
        self._loader = config_loader
        self._master = master
        hydra_overrides = OmegaConf.to_container(master.hydra.overrides.hydra)
        assert isinstance(hydra_overrides, list)
        self._hydra_overrides = [str(o) for o in hydra_overrides]
        self._config_name = master.hydra.job.config_name
        self._parser = OverridesParser.create()
        self._repos: dict[tuple[str, ...], CachingConfigRepository] = {}
        self._choices: dict[tuple[str, ...], bytes] = {}  # each choice's config, pickled
        self.full_compositions = 0

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """The job config of ``overrides`` (one job's list, as the sweeper hands it over)."""
        if not isinstance(self._loader, ConfigLoaderImpl):  # another loader: no shortcut
            return self._loader.load_sweep_config(self._master, list(overrides))
        own = list(overrides)
        # The list load_sweep_config composes: the sweep's hydra overrides, then the job's.
        parsed = self._parser.parse_overrides(self._hydra_overrides + own)
        job_parsed = parsed[len(self._hydra_overrides):]
        try:
            value_ids = self._value_override_ids(parsed)
        except ConfigCompositionException:  # a bad override: Hydra's own message, as it says it
            return self._loader.load_sweep_config(self._master, own)
        values = [o for o in job_parsed if id(o) in value_ids]
        choice = tuple(o.input_line or "" for o in job_parsed if id(o) not in value_ids)
        base = self._choices.get(choice)
        if base is None:
            base = self._choices[choice] = pickle.dumps(
                self._loader.load_sweep_config(self._master, list(choice)), PROTOCOL)
            self.full_compositions += 1
        cfg = pickle.loads(base)  # a deep copy of the choice's config (see copy_config)
        app = [o for o in parsed if not o.is_hydra_override()]
        try:
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
            cfg.hydra.overrides.task = [o.input_line for o in app]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=app,
                kv_sep=cfg.hydra.job.config.override_dirname.kv_sep,
                item_sep=cfg.hydra.job.config.override_dirname.item_sep,
                exclude_keys=cfg.hydra.job.config.override_dirname.exclude_keys,
            )
        except OmegaConfBaseException as err:  # as ConfigLoaderImpl.load_configuration wraps it
            raise ConfigCompositionException().with_traceback(sys.exc_info()[2]) from err
        OmegaConf.copy_cache(from_config=self._master, to_config=cfg)
        return cfg

    def _value_override_ids(self, parsed: list[Override]) -> set[int]:
        """The non-hydra overrides Hydra's defaults list hands back as ``config_overrides``
        (values, applied after composition), split on the repository this list's search
        path gives (``hydra.searchpath`` can add config groups)."""
        searchpath = tuple(o.input_line or "" for o in parsed
                           if o.get_key_element() == "hydra.searchpath")
        repo = self._repos.get(searchpath)
        if repo is None:
            _, repo = self._loader._parse_overrides_and_create_caching_repo(  # type: ignore[attr-defined]
                self._config_name, list(searchpath))
            self._repos[searchpath] = repo
        split = Overrides(repo, parsed)
        return {id(o) for o in split.config_overrides if not o.is_hydra_override()}


def copy_config(cfg: DictConfig) -> DictConfig:
    """A deep copy of ``cfg`` through OmegaConf's own pickling (``__getstate__`` /
    ``__setstate__`` of each node), equal to ``copy.deepcopy(cfg)`` in values,
    interpolations, flags, node types and parent links (``tests/hydra_plugins/
    test_compose.py``) at a fraction of its cost: a job config of about 235 nodes takes
    1.0 ms to pickle and 0.9 ms to unpickle against 5.3 ms to deep-copy, which walks the
    nodes in Python."""
    copied = pickle.loads(pickle.dumps(cfg, PROTOCOL))
    assert isinstance(copied, DictConfig)
    return copied
