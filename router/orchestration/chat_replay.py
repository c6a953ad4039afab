"""Replaying a chat stream from the start on another worker, and dropping from it what its
client already received: for the chats that a completion of token ids cannot continue.

vLLM parses a chat's output into deltas of several kinds: content, reasoning (with a
reasoning parser) and tool calls (with a tool parser, or forced by ``tool_choice``), each
call under an id vLLM draws for it. Text continued from token ids through
``/v1/completions`` (``migration.py``) goes through none of that parsing, and a grammar
(guided decoding) or a tool parser has state that only a run from the start rebuilds. A
greedy or seeded chat, sent again whole, gives the same deltas again: another worker
replays it, and the router drops from its deltas what the client has, channel by channel
(the role, the content, the reasoning, each tool call's name and arguments):

- a replayed piece must match what the client got of its channel, and is cut to what it
  did not get (``ContinuationDiverged`` otherwise);
- nothing new passes while any channel still owes text the client got: the pieces come
  in the original's order, so a new one before an owed one is a different answer;
- a tool call whose opening the client got keeps the id it got: the replay's opening,
  with the id vLLM drew anew, is dropped.

Past what was received, its chunks pass with the first answer's id and ``created`` and
the marks the caller adds. Its usage counts the whole answer: the replay generated it all.
A replay decodes again every token already sent (a continuation from token ids prefills
them in one pass), so plain greedy text keeps that path.

Invariant: what passes is the replay's text past what the client holds of every channel,
or the replay is refused; never text the original would not have sent.
"""

from __future__ import annotations

import json
import re
from typing import Any

from router.errors import ContinuationDiverged
from router.orchestration.sse_events import CONTENT, DATA, DONE, EVENT_END, OUTPUT_IDS

# A delta with more than plain content: read whole (most events are content alone).
_NOT_CONTENT = re.compile(rb'"(?:tool_calls|reasoning_content|reasoning|role)":\s*[\[{"]')
_CONTENT_CHANNEL = "content"


class ChatRecord:
    """What a chat stream's client received, by channel, as JSON-escaped text (the events
    are parsed whole only when they hold more than content). Past ``max_bytes`` it stops,
    and the stream can no longer be replayed."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._channels: dict[str, bytearray] = {}
        self._size = 0
        self.tokens = 0  # output tokens received, where the engine named them
        self._readable = True

    def __repr__(self) -> str:
        return f"ChatRecord(channels={len(self._channels)}, bytes={self._size})"

    def add(self, events: bytes) -> None:
        if not self._readable:
            return
        for event in events.split(EVENT_END):
            if not event.startswith(DATA) or event.startswith(DONE):
                continue
            if ids := OUTPUT_IDS.search(event):
                self.tokens += len(ids[1].split(b",")) if ids[1].strip() else 0
            if not _NOT_CONTENT.search(event):
                if (content := CONTENT.search(event)) and content[1]:
                    self._add(_CONTENT_CHANNEL, content[1])
                continue
            for choice in json.loads(event[len(DATA) :]).get("choices") or ():
                for channel, piece in _pieces(choice.get("delta") or {}):
                    self._add(channel, json.dumps(piece)[1:-1].encode())
        if self._size > self._max_bytes:
            self._readable, self._channels = False, {}

    def _add(self, channel: str, escaped: bytes) -> None:
        self._channels.setdefault(channel, bytearray()).extend(escaped)
        self._size += len(escaped)

    def read(self) -> dict[str, str] | None:
        """Each channel's text as received, or None past ``max_bytes``."""
        if not self._readable:
            return None
        return {name: json.loads(b'"' + text + b'"') for name, text in self._channels.items()}


def _pieces(delta: dict[str, Any]) -> list[tuple[str, str]]:
    """A delta's text by channel, in the order vLLM fills them: a tool call's name stands
    for its opening (with the id and type), its arguments for the rest."""
    pieces = [(key, value) for key, value in delta.items()
              if key != "tool_calls" and isinstance(value, str)]  # fmt: skip
    for call in delta.get("tool_calls") or ():
        function = call.get("function") or {}
        for part in ("name", "arguments"):
            if isinstance(function.get(part), str):
                pieces.append((f"tool_calls.{call.get('index', 0)}.{part}", function[part]))
    return pieces


class ReplayedChat:
    """A replayed chat's events, less what the client received (``owed``), with the
    first answer's top-level fields (``marks``: its id, ``created``, the migration)."""

    def __init__(self, owed: dict[str, str], marks: dict[str, Any]) -> None:
        self._owed = {channel: text for channel, text in owed.items() if text}
        self._opened_calls = {c.split(".")[1] for c in owed if c.endswith(".name")}
        self._marks = marks

    def __repr__(self) -> str:
        return f"ReplayedChat(owed_channels={len(self._owed)})"

    def edit(self, events: bytes) -> bytes:
        kept = [self._edit_one(e) for e in events.split(EVENT_END) if e]
        return b"".join(e + EVENT_END for e in kept if e)

    def _edit_one(self, event: bytes) -> bytes:
        if not event.startswith(DATA) or event.startswith(DONE):
            return event
        chunk = json.loads(event[len(DATA) :])
        choices = chunk.get("choices")
        if choices:
            if "prompt_token_ids" in chunk:  # the client got them in the first answer
                chunk["prompt_token_ids"] = None
            for choice in choices:
                choice["delta"] = self._cut(choice.get("delta") or {})
            if all(not c["delta"] and c.get("finish_reason") is None for c in choices):
                return b""  # all of it was received already
        chunk.update(self._marks)
        return DATA + json.dumps(chunk, separators=(",", ":")).encode()

    def _cut(self, delta: dict[str, Any]) -> dict[str, Any]:
        cut: dict[str, Any] = {}
        for key, value in delta.items():
            if key == "tool_calls":
                calls = [c for c in map(self._cut_call, value or ()) if c is not None]
                if calls:
                    cut[key] = calls
            elif not isinstance(value, str):
                continue  # a null field: what the client has says it already
            elif rest := self._take(key, value):
                cut[key] = rest
        return cut

    def _cut_call(self, call: dict[str, Any]) -> dict[str, Any] | None:
        index = call.get("index", 0)
        function = {}
        for part, value in (call.get("function") or {}).items():
            if isinstance(value, str) and (rest := self._take(f"tool_calls.{index}.{part}", value)):
                function[part] = rest
        cut: dict[str, Any] = {"index": index}
        if str(index) not in self._opened_calls:  # its opening is new to the client
            cut.update({k: call[k] for k in ("id", "type") if k in call})
        if function:
            cut["function"] = function
        return cut if len(cut) > 1 else None

    def _take(self, channel: str, piece: str) -> str:
        """What of ``piece`` the client has not received; raise where it differs."""
        owed = self._owed.get(channel, "")
        if owed:
            seen = min(len(piece), len(owed))
            if piece[:seen] != owed[:seen]:
                raise ContinuationDiverged
            piece, owed = piece[seen:], owed[seen:]
            if owed:
                self._owed[channel] = owed
                return ""
            del self._owed[channel]
        if piece and self._owed:
            raise ContinuationDiverged  # new text while the client is owed other text
        return piece
