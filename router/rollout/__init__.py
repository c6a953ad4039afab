"""Versions in production: the registry of versions and the routes (``rollout``), validated
and audited changes (``rollout_control``), the canary gate, the route's part in a
request (``rollout_path``), shadow traffic, the safety screens and the review queue.

Owns: which version serves, and the reviewers' policy. Control plane: never imports
``http``.
"""
