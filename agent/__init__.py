"""The worker agent: it runs and supervises one vLLM, reports it to the router, and
re-roles it when asked.

The core (``runner``, ``supervisor``, ``reporter``, ``placement``, the engine spec and
start-up fixes, the prefill-rate probe) knows how to start an engine, watch it and report
it; the roles (prefill, decode, colocated) are engine spec choices in ``agent/roles/``.
"""
