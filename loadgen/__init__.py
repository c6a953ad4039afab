"""The load generator behind ``pdserve bench`` and ``pdserve sim calibrate``.

Owns: what to send (``datasets``, ``traces``, ``words``), when (``arrivals``), sending it
and reading the stream (``client``, ``replay``), what came back (``metrics``, ``report``,
``prometheus_text``, ``cluster_view``), the bench command (``bench_cli``), and sim
calibration (``calibration``: the sweep and the fit; ``calibrate_cli``: the command).

May import the bottom (``contracts``, ``modelstore``). It works against any
OpenAI-compatible endpoint, so it never imports the router, the agents, the sim,
localrun or the benchmark scripts. One exception, named in
``tests/unit/test_import_direction.py``: calibration measures a real engine it starts and
fits a sim profile, so ``calibrate_cli`` may import the agent's engine spec, localrun
and the sim, and ``calibration`` the sim's profile. The scripts in ``benchmarks/`` import
from here, never the other way."""
