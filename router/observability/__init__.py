"""What the router reports: Prometheus metrics and their views, sliding windows, the cost
model, fleet accounting ($/1M tokens), the status snapshot, and the event loop's health.

Owns: every number the router publishes. May import: nothing of the request path but the
records it counts. Never ``http``.
"""
