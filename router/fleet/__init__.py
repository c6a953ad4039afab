"""The workers: the registry and their health, the pools and the P:D ratio controller
(``pool_control``), the networks workers may be in, and the loop that keeps replicas'
shared state in step (``state_sync``).

Owns: who exists, in which role, ready or not. Control plane: never imports ``http``.
"""
