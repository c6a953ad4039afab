"""Micro-benchmarks of router internals, each timing one piece in-process, no cluster:
``prefix_lookup`` (block hashing and the prefix index lookup per request),
``token_prefix_cache`` (tokenizing with and without the router's token prefix cache),
``safety_screen`` (the safety policy's CPU per streamed event).

Run as ``python -m benchmarks.router_micro.<name>`` from the repository root; results go
to ``benchmarks/results/``. This is the one place in benchmarks/ allowed to import the
router (``tests/unit/test_import_direction.py`` names it); the rest of benchmarks/ works
against any endpoint and may not."""
