"""Moving a stream whose engine died mid-answer to another worker, with nothing lost.

A streamed completion or chat keeps a ``Transcript`` of the events its client received.
The router asks the engine for the token ids (vLLM's ``return_token_ids``) and blanks
them out of what the client sees, so the client gets the bytes vLLM would have sent it.
When the engine fails mid-stream, ``Transcript.continuation`` says how to go on
elsewhere: as a ``/v1/completions`` call on token ids (a chat's prompt is its templated
prompt, which vLLM's first chat chunk names), its events rewritten into the original's
shape, or for some chats as the chat again:

- greedy (``temperature == 0``): the prompt plus the tokens already streamed, less
  the last event's, as a new prompt (computed by the worker itself), with the output
  cap less those tokens. The last event's text is generated again and checked against
  what the client got, then dropped: a cut inside a multi-byte character, or an
  engine whose greedy choice differs, shows up there as a divergence, not as text;
- seeded sampling: the same request again from the start (a seed fixes the whole
  sequence, not its continuation), all text the client got being checked and dropped;
- greedy with stop strings: replayed the same way. vLLM holds back the text that could
  begin a stop string (up to the longest one, less a character) while it streams the
  token ids, so what the client got ends short of what the streamed tokens say, by an
  amount the router cannot know without the tokenizer; replayed from the start, the new
  engine holds back and stops exactly as the first would have;
- unseeded sampling, only when ``stream_migration_inexact`` allows it (and no stop
  string holds text back): the prompt plus the tokens streamed up to the last event with
  text, sampled on from there. Not the answer the first engine would have given, but one
  the model could have;
- greedy or seeded with guided decoding (``response_format``, ``structured_outputs``):
  replayed the same way, its grammar then starting from the start as the first did;
- a chat replayed (seeded, a stop string, guided decoding, tools), or a greedy one whose
  deltas were not all text (reasoning, a tool call): the same chat again, less what the
  client received, channel by channel (``chat_replay.py``): the parsing of tool calls
  and reasoning happens only on a chat;
- anything else (logprobs, echo, unseeded sampling with tools or a grammar) is not
  migrated: the stream ends with an SSE error event, as before. ``n`` > 1 reaches here
  as one stream per choice (``fan_out.py``), each migrating on its own.

The continuation's events then carry the first answer's id and a ``pdserve_migration``
field (``{"exact": ..., "tokens_before": ...}``), and its usage counts the original
prompt and every token the client received.

Invariant: an exactly migrated stream's text is the uninterrupted one's, or it ends
with an error event; never a different text under a 200.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from router.errors import ContinuationDiverged
from router.orchestration.chat_replay import ChatRecord, ReplayedChat
from router.orchestration.sse_events import CONTENT, DATA, DONE, EVENT_END, OUTPUT_IDS
from router.prepare.prepare import Endpoint, PreparedRequest

# vLLM's completion chunks always carry both fields (null unless asked): a list becomes
# null again, and the client sees what it would have seen without the router's ask.
_TOKEN_ID_LISTS = re.compile(rb'"(prompt_token_ids|token_ids)":\s*\[[0-9,\s]*\]')
# Fields that make a continuation differ from the uninterrupted answer.
_NOT_CONTINUABLE = ("logprobs", "top_logprobs", "echo", "best_of", "prompt_logprobs")
# Fields whose output only a run from the start gives again: a grammar's state.
_FROM_THE_START = ("response_format", "guided_json", "guided_regex", "guided_choice",
                   "guided_grammar", "structured_outputs")  # fmt: skip
# A chat's fields that a completion of its templated prompt does without.
_CHAT_ONLY = ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template",
              "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
              "documents")  # fmt: skip
MIGRATION_FIELD = "pdserve_migration"


class ResumeMode(Enum):
    CONTINUE = "continue"  # greedy: the prompt plus the streamed tokens
    REPLAY = "replay"  # seeded: the same request again, the sent text dropped
    RESAMPLE = "resample"  # unseeded, when allowed: sampled on from the streamed tokens

    @property
    def exact(self) -> bool:
        return self is not ResumeMode.RESAMPLE


def resume_mode(request: PreparedRequest, *, inexact: bool = False) -> ResumeMode | None:
    """How a stream of ``request`` could go on elsewhere, or None: it cannot (exactly,
    unless ``inexact`` allows sampling on from the cut)."""
    body = request.body
    if not request.stream or body.get("n") not in (None, 1):
        return None
    if any(body.get(key) for key in _NOT_CONTINUABLE):
        return None
    chat = request.endpoint is Endpoint.CHAT
    if not chat and not _one_prompt(body.get("prompt")):
        return None
    from_the_start = (
        bool(body.get("stop"))  # the text held back for a stop string's possible start
        or any(body.get(key) for key in _FROM_THE_START)
        or (chat and bool(body.get("tools")) and body.get("tool_choice") != "none")
    )
    if body.get("temperature") == 0:
        return ResumeMode.REPLAY if from_the_start else ResumeMode.CONTINUE
    if isinstance(body.get("seed"), int):
        return ResumeMode.REPLAY
    return ResumeMode.RESAMPLE if inexact and not from_the_start else None


def _one_prompt(prompt: Any) -> bool:
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    )


@dataclass(frozen=True)
class Continuation:
    """Where a failed stream goes on from: the engine body and what to drop of its text."""

    body: dict[str, Any]  # for ``path``
    skip_text: str  # the continuation's first text, already received by the client
    tokens_before: int  # output tokens the client has that the continuation does not count
    output_tokens: int  # the continuation's own output cap
    path: str = "/v1/completions"


class Transcript:
    """The events a client received on one stream, and how to continue it."""

    def __init__(
        self, request: PreparedRequest, mode: ResumeMode, *, client_wants_ids: bool, max_bytes: int
    ) -> None:
        self._request = request
        self._mode = mode
        self._chat = request.endpoint is Endpoint.CHAT
        self._strip_ids = not client_wants_ids
        self._received = _Record(max_bytes, chat=self._chat)
        # Read only by a chat replay, which only an exact continuation may be.
        self._received_deltas = ChatRecord(max_bytes) if self._chat and mode.exact else None
        self._continuing: _ContinuedEvents | ReplayedChat | None = None

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
            if self._received_deltas is not None:
                self._received_deltas.add(events)
        return _TOKEN_ID_LISTS.sub(rb'"\1":null', events) if self._strip_ids else events

    def continuation(self) -> Continuation | None:
        """The next engine's body, and from now on ``edit`` rewrites its events; None when
        what was received does not say enough (no token ids, or past ``max_bytes``), or
        the stream was already continued once (its continuation is not recorded)."""
        if self._continuing is not None:
            return None
        received = self._received.read()
        replayed = self._mode is ResumeMode.REPLAY or received is None
        if self._chat and self._mode.exact and replayed:
            return self._chat_replay()
        if received is None:
            return None
        chunks = received.chunks
        if self._mode is ResumeMode.REPLAY:
            keep = 0
        elif self._mode is ResumeMode.CONTINUE:
            keep = max(0, len(chunks) - 1)
        else:  # sampled on after the last text: an event without text may hold half a character
            keep = max((i + 1 for i, (_, text) in enumerate(chunks) if text), default=0)
        kept_ids = [t for ids, _ in chunks[:keep] for t in ids]
        skip = "".join(text for _, text in chunks[keep:]) if self._mode.exact else ""
        left = self._request.max_output_tokens - len(kept_ids)
        if left < 1:
            return None
        dropped = ("kv_transfer_params", *(_CHAT_ONLY if self._chat else ()))
        body = {k: v for k, v in self._request.body.items() if k not in dropped}
        body.pop("max_completion_tokens", None)
        body.update(prompt=received.prompt_ids + kept_ids, max_tokens=left, stream=True,
                    return_token_ids=True)  # fmt: skip
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(0, body["min_tokens"] - len(kept_ids))
        marker = {"exact": self._mode.exact, "tokens_before": sum(len(ids) for ids, _ in chunks)}
        self._continuing = _ContinuedEvents(received, skip, len(kept_ids), marker, chat=self._chat)
        return Continuation(body, skip, len(kept_ids), output_tokens=left)

    def _chat_replay(self) -> Continuation | None:
        """The same chat again, less what its client received (``chat_replay.py``): for a
        chat replayed from the start, or one whose deltas were not all text."""
        assert self._received_deltas is not None
        owed = self._received_deltas.read()
        response_id, created = self._received.identity()
        if owed is None or not response_id:
            return None
        body = {k: v for k, v in self._request.body.items() if k != "kv_transfer_params"}
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        marker = {"exact": True, "tokens_before": self._received_deltas.tokens}
        marks = {"id": response_id, "created": created, MIGRATION_FIELD: marker}
        self._continuing = ReplayedChat(owed, marks)
        return Continuation(body, "", 0, output_tokens=self._request.max_output_tokens,
                            path="/v1/chat/completions")  # fmt: skip


@dataclass
class _Received:
    response_id: str
    created: int
    prompt_ids: list[int]
    chunks: list[tuple[list[int], str]]  # per event with output: its token ids and text


_RESPONSE_ID = re.compile(rb'"id":\s*"([^"\\]*)"')
_CREATED = re.compile(rb'"created":\s*([0-9]+)')
_PROMPT_IDS = re.compile(rb'"prompt_token_ids":\s*\[([0-9,\s]*)\]')
_TEXT = re.compile(rb'"text":\s*"((?:[^"\\]|\\.)*)"')
# A chat delta that is not plain text (a tool call, reasoning): nothing to go on from.
_NOT_TEXT = re.compile(rb'"(?:tool_calls|reasoning_content|reasoning)":\s*[\[{"]')
_EVENT_SEPARATOR, _TEXT_SEPARATOR = b";", b"\x00"  # neither occurs in what they separate


class _Record:
    """What a stream's client received, kept compact: each event's token ids and text
    (still JSON-escaped), about 12 bytes a token instead of the event's 200, read
    only when the stream must be continued. Past ``max_bytes`` it stops (and the
    stream can no longer migrate)."""

    def __init__(self, max_bytes: int, *, chat: bool) -> None:
        self._max_bytes = max_bytes
        self._text = CONTENT if chat else _TEXT
        self._response_id = b""
        self._created = b"0"
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
            if created := _CREATED.search(events):
                self._created = created[1]
        if not self._prompt_ids and (found := _PROMPT_IDS.search(events)):
            self._prompt_ids = found[1]
        for event in events.split(EVENT_END):
            ids, text = OUTPUT_IDS.search(event), self._text.search(event)
            if ids is None and (text is None or not text[1]):
                continue  # no output: a chat's role, the usage, [DONE]
            if ids is None or text is None or _NOT_TEXT.search(event):
                self._stop()  # output without its ids, or not text: nothing to go on from
                return
            self._ids += ids[1] + _EVENT_SEPARATOR
            self._texts += text[1] + _TEXT_SEPARATOR
        if len(self._ids) + len(self._texts) > self._max_bytes:
            self._stop()

    def identity(self) -> tuple[str, int]:
        """The first answer's id and ``created``: read from its first event, kept when the
        record stops."""
        return self._response_id.decode(), int(self._created)

    def _stop(self) -> None:
        self._readable = False
        self._ids, self._texts = bytearray(), bytearray()

    def read(self) -> _Received | None:
        if not (self._readable and self._prompt_ids):
            return None
        ids = [json.loads(b"[" + e + b"]") for e in self._ids.split(_EVENT_SEPARATOR)[:-1]]
        texts = [json.loads(b'"' + t + b'"') for t in self._texts.split(_TEXT_SEPARATOR)[:-1]]
        prompt = json.loads(b"[" + self._prompt_ids + b"]")
        return _Received(
            self._response_id.decode(), int(self._created), prompt,
            list(zip(ids, texts, strict=True)),
        )  # fmt: skip


class _ContinuedEvents:
    """The continuation's completion events made the first answer's: its id and shape
    (a chat's chunks), the received text checked and dropped, the usage counted from
    the original prompt, and the migration said."""

    def __init__(
        self,
        received: _Received,
        skip: str,
        tokens_before: int,
        marker: dict[str, Any],
        *,
        chat: bool,
    ) -> None:
        self.received_before = received
        self._skip = skip
        self._tokens_before = tokens_before
        self._marker = marker
        self._chat = chat

    def edit(self, events: bytes) -> bytes:
        kept = [self._edit_one(e) for e in events.split(EVENT_END) if e]
        return b"".join(e + EVENT_END for e in kept if e)

    def _edit_one(self, event: bytes) -> bytes:
        if not event.startswith(DATA) or event.startswith(DONE):
            return event
        chunk = json.loads(event[len(DATA) :])
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
        if self._chat:
            chunk = self._as_chat_chunk(chunk)
        chunk[MIGRATION_FIELD] = self._marker
        return DATA + json.dumps(chunk, separators=(",", ":")).encode()

    def _as_chat_chunk(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """A completion chunk as the chat chunk vLLM would have sent in its place."""
        choices = []
        for choice in chunk.get("choices") or ():
            chat_choice = {"index": choice.get("index", 0),
                           "delta": {"content": choice.get("text") or ""}, "logprobs": None,
                           "finish_reason": choice.get("finish_reason")}  # fmt: skip
            if chat_choice["finish_reason"] is not None:
                chat_choice["stop_reason"] = choice.get("stop_reason")
            chat_choice["token_ids"] = choice.get("token_ids")
            choices.append(chat_choice)
        return {**chunk, "object": "chat.completion.chunk",
                "created": self.received_before.created, "choices": choices}  # fmt: skip
