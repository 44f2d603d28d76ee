"""Adapter that times one collective or send/recv by running a real ASTRA-Sim binary.

For users who have built ``AstraSim_Analytical_Congestion_Unaware`` (e.g. the LLMServingSim fork)
and want its numbers instead of the analytical model's. Per call it writes, into a scratch
directory: the network ``.yml``, the ``system.json``, a memory config, and one Chakra trace per
NPU holding the single node; runs the binary with every NPU as its own start NPU; answers each
``Waiting`` prompt with ``done`` until every NPU has reported
``sys[<i>] iteration <k> finished, <T> cycles``, then ``exit``; and returns the largest ``T``
(cycles are ns). Results are cached per collective shape (operation, bytes, involved
dimensions; for a send: bytes, source, destination), so a simulation runs the binary once per
distinct shape. A deployment selects this backend with ``comm_backend: astra_sim`` and
``astra_sim_binary: <path>`` (:mod:`astra_bridge.backend`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from astra_bridge.chakra_et import (
    FORK_NODE_TYPES,
    EtNode,
    collective_node,
    p2p_node,
    write_traces,
)
from astra_bridge.collectives import parse_collective
from astra_bridge.topology import (
    SystemConfig,
    Topology,
    network_config_to_yaml,
    system_config_to_dict,
)
from engine.specs import ConfigError

FINISHED_RE = re.compile(r"sys\[(\d+)\]\s+iteration\s+\d+\s+finished,\s+(\d+)\s+cycles")
DEFAULT_MEMORY_CONFIG = {
    "remote_mem": {
        "memory-type": "PER_NODE_MEMORY_EXPANSION",
        "mem-bw": 256,
        "mem-latency": 0,
        "num-devices": 1,
    }
}


class BinaryBackendError(ConfigError):
    """The ASTRA-Sim binary is missing, failed, or printed no completion time."""


def find_binary(binary: str | Path) -> tuple[Path | None, str]:
    """``(the executable at binary, "")`` (a path, or a name on ``PATH``), or ``(None, what is
    wrong)`` when it is missing or not executable."""
    path = Path(binary).expanduser()
    if not path.is_file():
        found = shutil.which(str(binary))
        if found is None:
            return None, f"no file at {binary!s}"
        path = Path(found)
    if not os.access(path, os.X_OK):
        return None, f"{path} is not executable (chmod +x it, or give the built binary)"
    return path, ""


def resolve_binary(binary: str | Path) -> Path:
    """The executable at ``binary``; :class:`BinaryBackendError` when it is missing or not
    executable."""
    path, problem = find_binary(binary)
    if path is None:
        raise BinaryBackendError(
            f"ASTRA-Sim binary: {problem}; build AstraSim_Analytical_Congestion_Unaware and "
            "pass its path, or use the analytical NetworkModel"
        )
    return path


def parse_finish_times(stdout: str) -> dict[int, int]:
    """``{npu: cycles}`` from the ``sys[i] iteration k finished, T cycles`` lines (last wins)."""
    return {int(m.group(1)): int(m.group(2)) for m in FINISHED_RE.finditer(stdout)}


class BinaryBackend:
    """Times collectives with an ASTRA-Sim analytical binary given by path."""

    def __init__(
        self,
        binary: str | Path,
        topology: Topology,
        system: SystemConfig,
        *,
        memory_config: Mapping[str, object] | None = None,
        node_types: Mapping[str, int] = FORK_NODE_TYPES,
        workdir: str | Path | None = None,
        timeout_s: float = 120.0,
        keep_files: bool = False,
    ) -> None:
        self.binary = resolve_binary(binary)
        self.topology = topology
        self.system = system
        self.memory_config = dict(memory_config or DEFAULT_MEMORY_CONFIG)
        self.node_types = dict(node_types)
        self.workdir = Path(workdir) if workdir is not None else None
        self.timeout_s = timeout_s
        self.keep_files = keep_files
        self._cache: dict[tuple[object, ...], int] = {}

    # ----------------------------------------------------------------- inputs

    def write_inputs(self, run_dir: Path, per_npu: Mapping[int, list[EtNode]]) -> list[str]:
        """Write configs and traces into ``run_dir``; return the command line to run."""
        run_dir.mkdir(parents=True, exist_ok=True)
        net = run_dir / "network.yml"
        net.write_text(network_config_to_yaml(self.topology))
        sys_path = run_dir / "system.json"
        sys_path.write_text(json.dumps(system_config_to_dict(self.system), indent=2))
        mem = run_dir / "memory.json"
        mem.write_text(json.dumps(self.memory_config, indent=2))
        prefix = run_dir / "workload" / "comm"
        n = self.topology.num_npus
        write_traces(prefix, per_npu, n)
        return [
            str(self.binary),
            f"--workload-configuration={prefix}",
            f"--system-configuration={sys_path}",
            f"--network-configuration={net}",
            f"--memory-configuration={mem}",
            "--start-npu-ids=" + "".join(f"{i}," for i in range(n)),
        ]

    # ----------------------------------------------------------------- running

    def _drive(self, cmd: list[str], run_dir: Path, needed: set[int]) -> str:
        """Run the interactive binary: ``done`` at each prompt until the ``needed`` NPUs have
        reported, then ``exit``."""
        n = len(needed)
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=run_dir,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            raise BinaryBackendError(f"cannot start ASTRA-Sim binary {self.binary}: {exc}") from exc
        timed_out = threading.Event()

        def on_timeout() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(self.timeout_s, on_timeout)
        timer.start()
        lines: list[str] = []
        reported: set[int] = set()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                m = FINISHED_RE.search(line)
                if m and int(m.group(1)) in needed:
                    reported.add(int(m.group(1)))
                if "Waiting" in line:
                    answer = "exit" if len(reported) >= n else "done"
                    try:
                        proc.stdin.write(answer + "\n")
                        proc.stdin.flush()
                    except BrokenPipeError:
                        break
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out = "".join(lines)
        if timed_out.is_set():
            raise BinaryBackendError(
                f"ASTRA-Sim did not finish within {self.timeout_s}s ({len(reported)}/{n} NPUs "
                f"reported); raise timeout_s or check the inputs; last output:\n{out[-2000:]}"
            )
        if len(reported) < n:
            raise BinaryBackendError(
                f"ASTRA-Sim exited with code {proc.returncode} after {len(reported)}/{n} NPUs "
                f"reported; last output:\n{out[-2000:]}"
            )
        return out

    def _run(self, key: tuple[object, ...], per_npu: Mapping[int, list[EtNode]]) -> int:
        """Run one workload (cached by ``key``); max finish time over the NPUs with a node."""
        if key in self._cache:
            return self._cache[key]
        base = self.workdir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix="astra_", dir=base))
        try:
            cmd = self.write_inputs(run_dir, per_npu)
            out = self._drive(cmd, run_dir, set(per_npu))
        finally:
            if not self.keep_files:
                shutil.rmtree(run_dir, ignore_errors=True)
        times = parse_finish_times(out)
        if not times:
            raise BinaryBackendError(
                "ASTRA-Sim printed no 'sys[i] iteration k finished, T cycles' line; output:\n"
                + out[-2000:]
            )
        result = max(t for npu, t in times.items() if npu in per_npu)
        self._cache[key] = result
        return result

    def collective_ns(
        self, op: str, nbytes: int, *, involved_dims: Sequence[bool] | None = None
    ) -> int:
        """Completion time (ns, max over NPUs) of one collective over the ``involved_dims`` of
        the topology (one flag per dimension; None: all dimensions), as
        :meth:`astra_bridge.NetworkModel.collective_ns` takes them."""
        op = parse_collective(op)
        n = len(self.topology.dims)
        flags = (True,) * n if involved_dims is None else tuple(bool(f) for f in involved_dims)
        if len(flags) != n:
            raise ConfigError(
                f"involved_dims {list(flags)}: the topology has {n} dimensions; give one flag each"
            )
        if not any(flags):
            raise ConfigError("involved_dims: no dimension takes part; set at least one flag")
        node = collective_node(op, nbytes, self.node_types, flags)
        per_npu = {i: [node] for i in range(self.topology.num_npus)}
        return self._run(("coll", op, nbytes, flags), per_npu)

    def p2p_ns(self, nbytes: int, src: int, dst: int) -> int:
        """Completion time (ns) of a send from NPU ``src`` to NPU ``dst``."""
        self.topology.coords(src)
        self.topology.coords(dst)
        if src == dst:
            raise ConfigError(f"send/recv: src and dst are both NPU {src}; give two NPUs")
        per_npu = {
            src: [p2p_node(True, nbytes, src, dst, self.node_types)],
            dst: [p2p_node(False, nbytes, src, dst, self.node_types)],
        }
        return self._run(("p2p", nbytes, src, dst), per_npu)
