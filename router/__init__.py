"""The router: the OpenAI-compatible front door, the request path and the control plane.

A package of subpackages, one per step of the request path plus the control plane, so
that the folder picture is the architecture:

    http -> prepare -> admission -> scheduling -> orchestration (-> relay)
    fleet, rollout, state: the control plane; observability: what it all reports
    batch: files and batches, run through the same path at the lowest priority

Beside them, what every subpackage may use: ``errors`` (OpenAI's error shape),
``settings`` (the typed knobs) and ``parts`` (the long-lived objects one router holds).
"""
