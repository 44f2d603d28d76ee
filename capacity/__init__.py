"""Capacity planning: the largest load each configuration serves within the study's SLO, what
it costs, and the cheapest fleet for a target traffic.

* ``capacity.search``: the max-rate search (bracketing + bisection on probe outcomes);
* ``capacity.fleet``: fleet sizing and the cost Pareto front;
* ``capacity.study``: the searches of every configuration of a grid, probes cached;
* ``capacity.pool``: where probes run (a Ray actor pool or this process), one probe being one
  ``sweep.job.run_point`` run judged by ``analysis.answers``;
* ``capacity.verify``: a sized fleet re-simulated as one cluster;
* ``capacity.tracking``: the MLflow records;
* ``capacity.schema``: the ``capacity`` config node;
* ``capacity.run``: the whole command (compose, search, size, write, report, log);
* ``capacity.report`` and ``capacity.plots``: the self-contained HTML report, generated from
  what the run wrote.

``python -m sweep.capacity +experiment=capacity_search`` is the Hydra front of
``capacity.run.run_study``; ``python -m analysis report <dir>`` (or
``python -m capacity.report <dir>``) re-renders a report. The SLO, the per-request metrics and
the cost are ``analysis.slo``, ``analysis.metrics`` and ``analysis.cost``: the ones sweeps use.
"""
