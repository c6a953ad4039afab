"""Choosing workers: the prefix index and its KV event feed (``prefix_tracking``), in-
flight load, the filter -> score -> pick plug-ins and the P/D decider
(``scheduling_plugins``), and the scheduler that applies a model's policy
(``schedule``).

Owns: which worker serves which step. May import: ``prepare`` (blocks), ``fleet``
(workers), ``observability``. Never ``http``.
"""
