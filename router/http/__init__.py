"""The front door: the OpenAI-compatible API and the admin API as one route table (``api``,
``admin_api``, ``rollout_api``), access scopes (``access``), the hot routes served
straight from ASGI (``fast_path``), request ids, and the app that builds the parts and
mounts the routes (``app``, run by ``server``).

Owns: every route and its access level. May import: everything below it. Nothing imports
``http`` but the ``cli``, and nothing imports ``app`` but ``server``.
"""
