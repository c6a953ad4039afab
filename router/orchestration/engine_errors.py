"""How a call to a worker engine failed, for the orchestrator to decide what to do.

``EngineUnreachable`` means the worker may be dead (retry elsewhere, mark it unhealthy);
``EngineNotReached``, one kind of it, that the request never got there (no connection),
so a KV handoff it carried is still unpulled and may go to another decode;
``EngineHTTPError`` means the engine answered and refused.
"""

from __future__ import annotations

import re


class EngineUnreachable(Exception):
    """Connect failure, reset or timeout before a complete answer."""


class EngineNotReached(EngineUnreachable):
    """No connection carried the request to the engine: it never saw it. (Sent and then
    unanswered, a request may have been acted on: a decode may have pulled its KV.)"""


class EngineHTTPError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"engine answered {status}")
        self.status = status
        self.body = body


class EngineAborted(Exception):
    """The engine cut the answer short: ``finish_reason: "abort"`` (vLLM's engine core
    ends every request in flight so when it shuts down), an error sent in band, or a
    stream's end with no choice finished. Never relayed as a whole answer."""


ABORTED = re.compile(rb'"finish_reason":\s*"abort"')
