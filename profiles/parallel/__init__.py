"""Step latency of one instance with TP / PP / EP, its DP group and its P/D hand-off.

One module per job:

* :mod:`profiles.parallel.layout`: the parallel degrees of an instance (``ParallelLayout``), the
  reference cluster JSON's parallelism inference and the network the layout spans;
* :mod:`profiles.parallel.dp_pad`: how a lock-step DP group's batches are lined up (vLLM's
  ``VllmDpPad``, the reference's ``pad_dp_group``), the engine's ``DpPad``;
* :mod:`profiles.parallel.latency`: ``ParallelLatencyModel``, per-rank compute plus
  collectives, PP sends and host I/O (the engine's ``LatencyModel``), and its factory;
* :mod:`profiles.parallel.pd_transfer`: the prefill-to-decode KV hand-off (the engine's
  ``KvTransfer``);
* :mod:`profiles.parallel.comm`: which source prices the TP / EP collectives (hand-set
  cluster links: the analytical model; else aiconfigurator's measured tables where the GPU
  has them) and the measured network.

The formulas follow the reference simulator's trace + ASTRA-Sim graph (docs/reference-semantics.md
§6-§8); the collectives are priced by :mod:`astra_bridge` (the embedded
analytical model, or an ASTRA-Sim binary: :class:`astra_bridge.CommBackend`) or, on the
catalog's links, by aiconfigurator's measured tables (:mod:`profiles.parallel.comm`).
"""
