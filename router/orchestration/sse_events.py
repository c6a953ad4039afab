"""How vLLM's SSE events are framed, and the fields the router reads out of them without
parsing the JSON (a regex per event costs a fraction of ``json.loads``)."""

from __future__ import annotations

import re

EVENT_END = b"\n\n"
DATA = b"data: "
DONE = b"data: [DONE]"
# A choice's output token ids (vLLM's ``return_token_ids``), and a chat delta's content.
OUTPUT_IDS = re.compile(rb'"token_ids":\s*\[([0-9,\s]*)\]')
CONTENT = re.compile(rb'"content":\s*"((?:[^"\\]|\\.)*)"')
