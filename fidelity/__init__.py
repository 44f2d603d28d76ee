"""Scheduler fidelity harness: our scheduler/KV cache beside vLLM 0.19.1's own, step by step.

``sides`` wraps each scheduler behind one small interface, ``diff`` drives both in lockstep
with the same arrivals per step and compares what they decide, ``cases`` lists the
configurations and workloads, and ``run`` writes the report (``docs/fidelity.md``). Only
``sides.VllmSide`` needs vLLM; it is imported lazily so the rest loads without it.

vLLM 0.19.1 lives in its own venv outside the checkout (``scripts/install_fidelity.sh``
builds it and prints its path); there ``python -m fidelity.run`` writes the report and
``python -m pytest tests/fidelity`` runs the differential tests.
"""
