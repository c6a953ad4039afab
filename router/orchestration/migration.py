"""Moving a stream whose engine died mid-answer to another worker, with nothing lost.

A streamed completion keeps a ``Transcript`` of the events its client received. The
router asks the engine for the token ids (vLLM's ``return_token_ids``) and blanks them
out of what the client sees, so the client gets the bytes vLLM would have sent it.
When the engine fails mid-stream, ``Transcript.continuation`` says how to go on
elsewhere:

- greedy (``temperature == 0``): the prompt plus the tokens already streamed, less
  the last event's, as a new prompt (computed by the worker itself), with the output
  cap less those tokens. The last event's text is generated again and checked against
  what the client got, then dropped: a cut inside a multi-byte character, or an
  engine whose greedy choice differs, shows up there as a divergence, not as text;
- seeded sampling: the same request again from the start (a seed fixes the whole
  sequence, not its continuation), all text the client got being checked and dropped;
- anything else (unseeded sampling, n > 1, logprobs, stop strings, echo, chat) is
  not migrated: the stream ends with an SSE error event, as before.

The continuation's events then carry the first answer's id, and its usage counts the
original prompt and every token the client received.

Invariant: a migrated stream's text is the uninterrupted one's, or it ends with an
error event; never a different text under a 200.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from router.errors import UpstreamFailed
from router.prepare.prepare import Endpoint, PreparedRequest

_EVENT_END = b"\n\n"
_DATA = b"data: "
_DONE = b"data: [DONE]"
# vLLM's completion chunks always carry both fields (null unless asked): a list becomes
# null again, and the client sees what it would have seen without the router's ask.
_TOKEN_ID_LISTS = re.compile(rb'"(prompt_token_ids|token_ids)":\s*\[[0-9,\s]*\]')
# Fields that make a continuation differ from the uninterrupted answer.
_NOT_CONTINUABLE = ("logprobs", "echo", "stop", "best_of", "response_format", "guided_json",
                    "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
                    "prompt_logprobs")  # fmt: skip


class ResumeMode(Enum):
    CONTINUE = "continue"  # greedy: the prompt plus the streamed tokens
    REPLAY = "replay"  # seeded: the same request again, the sent text dropped


class ContinuationDiverged(UpstreamFailed):
    """The continuation's text is not what the client already received."""

    def __init__(self) -> None:
        super().__init__(
            "the stream's engine failed and its continuation on another worker diverged "
            "from the text already sent",
            code="migration_diverged",
        )


def resume_mode(request: PreparedRequest) -> ResumeMode | None:
    """How a stream of ``request`` could go on elsewhere, or None: it cannot exactly."""
    body = request.body
    if not request.stream or request.endpoint is not Endpoint.COMPLETIONS:
        return None
    if body.get("n") not in (None, 1) or any(body.get(key) for key in _NOT_CONTINUABLE):
        return None
    prompt = body.get("prompt")
    single = isinstance(prompt, str) or (
        isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    )
    if not single:
        return None
    if body.get("temperature") == 0:
        return ResumeMode.CONTINUE
    if isinstance(body.get("seed"), int):
        return ResumeMode.REPLAY
    return None


@dataclass(frozen=True)
class Continuation:
    """Where a failed stream goes on from: the engine body and what to drop of its text."""

    body: dict[str, Any]
    skip_text: str  # the continuation's first text, already received by the client
    tokens_before: int  # output tokens the client has that the continuation does not count


class Transcript:
    """The events a client received on one stream, and how to continue it."""

    def __init__(
        self, request: PreparedRequest, mode: ResumeMode, *, client_wants_ids: bool, max_bytes: int
    ) -> None:
        self._request = request
        self._mode = mode
        self._strip_ids = not client_wants_ids
        self._received = _Record(max_bytes)
        self._continuing: _ContinuedEvents | None = None

    def __repr__(self) -> str:
        return f"Transcript(mode={self._mode.value}, {self._received!r})"

    @staticmethod
    def engine_body(body: dict[str, Any]) -> dict[str, Any]:
        """The body the engine gets: with the token ids the transcript needs."""
        return {**body, "return_token_ids": True}

    def edit(self, events: bytes) -> bytes:
        """What the client gets of a run of whole events from the current engine."""
        if self._continuing is not None:
            events = self._continuing.edit(events)
        else:
            self._received.add(events)
        return _TOKEN_ID_LISTS.sub(rb'"\1":null', events) if self._strip_ids else events

    def continuation(self) -> Continuation | None:
        """The next engine's body, and from now on ``edit`` rewrites its events; None when
        what was received does not say enough (no token ids, or past ``max_bytes``), or
        the stream was already continued once (its continuation is not recorded)."""
        if self._continuing is not None:
            return None
        received = self._received.read()
        if received is None:
            return None
        keep = 0 if self._mode is ResumeMode.REPLAY else max(0, len(received.chunks) - 1)
        kept_ids = [t for ids, _ in received.chunks[:keep] for t in ids]
        skip = "".join(text for _, text in received.chunks[keep:])
        left = self._request.max_output_tokens - len(kept_ids)
        if left < 1:
            return None
        body = {k: v for k, v in self._request.body.items() if k != "kv_transfer_params"}
        body.pop("max_completion_tokens", None)
        body.update(prompt=received.prompt_ids + kept_ids, max_tokens=left, stream=True,
                    return_token_ids=True)  # fmt: skip
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(0, body["min_tokens"] - len(kept_ids))
        self._continuing = _ContinuedEvents(received, skip, len(kept_ids))
        return Continuation(body, skip, len(kept_ids))


@dataclass
class _Received:
    response_id: str
    prompt_ids: list[int]
    chunks: list[tuple[list[int], str]]  # per event with output: its token ids and text


_RESPONSE_ID = re.compile(rb'"id":\s*"([^"\\]*)"')
_PROMPT_IDS = re.compile(rb'"prompt_token_ids":\s*\[([0-9,\s]*)\]')
_OUTPUT_IDS = re.compile(rb'"token_ids":\s*\[([0-9,\s]*)\]')
_TEXT = re.compile(rb'"text":\s*"((?:[^"\\]|\\.)*)"')
_EVENT_SEPARATOR, _TEXT_SEPARATOR = b";", b"\x00"  # neither occurs in what they separate


class _Record:
    """What a stream's client received, kept compact: each event's token ids and text
    (still JSON-escaped), about 12 bytes a token instead of the event's 200, read
    only when the stream must be continued. Past ``max_bytes`` it stops (and the
    stream can no longer migrate)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._response_id = b""
        self._prompt_ids = b""
        self._ids, self._texts = bytearray(), bytearray()
        self._readable = True

    def __repr__(self) -> str:
        return f"_Record(bytes={len(self._ids) + len(self._texts)}, readable={self._readable})"

    def add(self, events: bytes) -> None:
        if not self._readable:
            return
        if not self._response_id and (found := _RESPONSE_ID.search(events)):
            self._response_id = found[1]
        if not self._prompt_ids and (found := _PROMPT_IDS.search(events)):
            self._prompt_ids = found[1]
        ids, texts = _OUTPUT_IDS.findall(events), _TEXT.findall(events)
        if len(ids) != len(texts):  # an event without its token ids: nothing to go on from
            self._stop()
            return
        for event_ids, text in zip(ids, texts, strict=True):
            self._ids += event_ids + _EVENT_SEPARATOR
            self._texts += text + _TEXT_SEPARATOR
        if len(self._ids) + len(self._texts) > self._max_bytes:
            self._stop()

    def _stop(self) -> None:
        self._readable = False
        self._ids, self._texts = bytearray(), bytearray()

    def read(self) -> _Received | None:
        if not (self._readable and self._prompt_ids):
            return None
        ids = [json.loads(b"[" + e + b"]") for e in self._ids.split(_EVENT_SEPARATOR)[:-1]]
        texts = [json.loads(b'"' + t + b'"') for t in self._texts.split(_TEXT_SEPARATOR)[:-1]]
        prompt = json.loads(b"[" + self._prompt_ids + b"]")
        return _Received(self._response_id.decode(), prompt, list(zip(ids, texts, strict=True)))


class _ContinuedEvents:
    """The continuation's events made the first answer's: its id, the received text
    checked and dropped, the usage counted from the original prompt."""

    def __init__(self, received: _Received, skip: str, tokens_before: int) -> None:
        self.received_before = received
        self._skip = skip
        self._tokens_before = tokens_before

    def edit(self, events: bytes) -> bytes:
        kept = [self._edit_one(e) for e in events.split(_EVENT_END) if e]
        return b"".join(e + _EVENT_END for e in kept if e)

    def _edit_one(self, event: bytes) -> bytes:
        if not event.startswith(_DATA) or event.startswith(_DONE):
            return event
        chunk = json.loads(event[len(_DATA) :])
        chunk["id"] = self.received_before.response_id
        usage = chunk.get("usage")
        if isinstance(usage, dict) and not chunk.get("choices"):
            prompt = len(self.received_before.prompt_ids)
            completion = int(usage.get("completion_tokens") or 0) + self._tokens_before
            chunk["usage"] = {**usage, "prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}  # fmt: skip
        for choice in chunk.get("choices") or ():
            choice["prompt_token_ids"] = None  # the client got the original prompt's
            text = str(choice.get("text") or "")
            if self._skip:
                seen = min(len(text), len(self._skip))
                if text[:seen] != self._skip[:seen]:
                    raise ContinuationDiverged
                self._skip, text = self._skip[seen:], text[seen:]
                choice["text"] = text
                if not text and choice.get("finish_reason") is None:
                    return b""  # all of it was received already
        return _DATA + json.dumps(chunk, separators=(",", ":")).encode()
