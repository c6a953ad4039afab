"""Agents' tokens: one per worker id, minted from the router's ``agent_secret``.

A token names the worker it is for and carries an HMAC of that id under the secret, so
the router checks it without keeping any state (every replica agrees), and a host that
holds one worker's token cannot register, heartbeat or deregister another worker id.
The secret stays with whoever launches agents; each agent gets only its own token.

Shape: ``pdsa1.<worker id, base64url>.<hex HMAC-SHA256>``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

PREFIX = "pdsa1"


def agent_token(secret: str, worker_id: str) -> str:
    encoded = base64.urlsafe_b64encode(worker_id.encode()).decode().rstrip("=")
    return f"{PREFIX}.{encoded}.{_mac(secret, worker_id)}"


def token_worker(token: str) -> str | None:
    """The worker id a token names, unchecked (None: not an agent token)."""
    prefix, _, rest = token.partition(".")
    encoded = rest.partition(".")[0]
    if prefix != PREFIX or not encoded:
        return None
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def verified_worker(secret: str, token: str) -> str | None:
    """The worker id ``token`` was minted for under ``secret``; None if it was not."""
    worker_id = token_worker(token)
    if worker_id is None:
        return None
    expected = agent_token(secret, worker_id)
    return worker_id if hmac.compare_digest(token.encode(), expected.encode()) else None


def _mac(secret: str, worker_id: str) -> str:
    message = f"pdserve-agent\0{worker_id}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
