"""The admit stage: may this request start now? Runs after prepare, before schedule.

Empty today, on purpose: every request is admitted. This is where admission control
lands (tenant token buckets, prefill queue bounds in uncached tokens, predicted-TTFT
early rejection, decode KV headroom): it sees the prepared request, the pools that
would serve it and the prompt's blocks, and either returns or raises an ``APIError``
(429 with Retry-After, 503).
"""

from __future__ import annotations

from router.prepare import PreparedRequest
from router.prompt_blocks import PromptBlocks
from router.registry import Pools


class Admission:
    def __repr__(self) -> str:
        return "Admission(admit everything)"

    async def admit(self, request: PreparedRequest, pools: Pools, blocks: PromptBlocks) -> None:
        """Raise to refuse; return to let the request be scheduled."""
        del request, pools, blocks
