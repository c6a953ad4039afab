"""Local clusters and processes: the router, agents and engines on one box, as process groups.

Used by ``pdserve up``, the tests and the benchmarks, so that what the tests prove is
what the launcher runs."""
