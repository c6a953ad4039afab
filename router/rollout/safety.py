"""Running a route's safety policy (``contracts.safety``): on the input, on a whole answer,
and on a stream as it passes.

- ``Screen.check``: every check of one direction on one text; returns the hits (a block
  first). Pattern checks are compiled once per policy; HTTP checks call the classifier
  with their timeout, and a failure counts as a hit only for ``on_failure: closed``.
- ``StreamScreen``: per stream, pattern checks on each event's new text plus a lookback
  (``stream_lookback_chars``), so a match that spans events is caught before the event
  that completes it is relayed; HTTP checks once on the whole text before ``[DONE]``.
  Cost per event: one JSON parse and the regexes over at most lookback + new characters.
- ``Hit.block`` is the error the client gets: a 400 ``content_policy_violation`` (an
  error event on a stream); ``flag`` hits are queued for the reviewer by ``on_flag``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from contracts.safety import Direction, HookCheck, PatternCheck, SafetyPolicy
from router.errors import InvalidRequest

log = logging.getLogger("pdserve.router")


@dataclass(frozen=True, slots=True)
class Hit:
    check: str
    category: str
    action: str  # block or flag
    direction: Direction
    why: str  # "matched", or "hook failed (fail-closed)"

    def error(self, param: str | None) -> InvalidRequest:
        where = "the request" if self.direction == "input" else "the model's output"
        return InvalidRequest(
            f"{where} was blocked by the safety policy (check {self.check!r}, "
            f"category {self.category!r})",
            param=param, code="content_policy_violation",
        )  # fmt: skip


_WORD = re.compile(r"\w+")
_LEADING_WORD = re.compile(r"^\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class Blocklist:
    """Words and phrases matched as whole words in any case, punctuation and spacing
    between a phrase's words ignored. A set lookup per word of the text: a regex
    alternation of 1,000 words cost 40x more per streamed event (benchmarks)."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        self._phrases: dict[str, list[tuple[str, ...]]] = {}
        for entry in entries:
            words = tuple(_words(entry))
            if words:
                self._phrases.setdefault(words[0], []).append(words[1:])

    def search(self, text: str) -> bool:
        words = _words(text)
        for at, word in enumerate(words):
            for rest in self._phrases.get(word, ()):
                if tuple(words[at + 1 : at + 1 + len(rest)]) == rest:
                    return True
        return False


def _compiled(check: PatternCheck) -> list[re.Pattern[str] | Blocklist]:
    """Each pattern on its own (a pattern may carry its own inline flags), and the
    blocklist."""
    compiled: list[re.Pattern[str] | Blocklist] = [
        re.compile(pattern, re.IGNORECASE) for pattern in check.patterns
    ]
    if check.blocklist:
        compiled.append(Blocklist(check.blocklist))
    return compiled


HookCaller = Callable[[HookCheck, dict[str, Any]], Awaitable[dict[str, Any]]]


class Screen:
    """One route's policy, compiled; shared by its requests."""

    def __init__(self, policy: SafetyPolicy, *, model: str, call_hook: HookCaller) -> None:
        self.policy = policy
        self._model = model
        self._call_hook = call_hook
        self._patterns: list[tuple[PatternCheck, list[re.Pattern[str] | Blocklist]]] = [
            (check, _compiled(check)) for check in policy.checks if isinstance(check, PatternCheck)
        ]

    def __repr__(self) -> str:
        return f"Screen({self._model}, checks={len(self.policy.checks)})"

    def active(self, direction: Direction) -> bool:
        return bool(self.policy.checks_for(direction))

    def pattern_hits(self, direction: Direction, text: str) -> list[Hit]:
        return [
            Hit(check.name, check.category, check.action, direction, "matched")
            for check, patterns in self._patterns
            if check.applies(direction) and any(p.search(text) for p in patterns)
        ]

    async def hook_hits(self, direction: Direction, text: str) -> list[Hit]:
        hooks = [c for c in self.policy.checks_for(direction) if isinstance(c, HookCheck)]
        if not hooks:
            return []
        verdicts = await asyncio.gather(*(self._ask(hook, direction, text) for hook in hooks))
        return [hit for hit in verdicts if hit is not None]

    async def check(self, direction: Direction, text: str) -> list[Hit]:
        hits = self.pattern_hits(direction, text) + await self.hook_hits(direction, text)
        return sorted(hits, key=lambda hit: hit.action != "block")

    async def _ask(self, hook: HookCheck, direction: Direction, text: str) -> Hit | None:
        payload = {"text": text, "direction": direction, "check": hook.name, "model": self._model}
        try:
            answer = await asyncio.wait_for(self._call_hook(hook, payload), hook.timeout_s)
            flagged = bool(answer.get("flagged"))
            category = str(answer.get("category") or hook.category)[:64]
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError) as error:
            log.warning("safety hook %s failed (fail-%s): %s", hook.name, hook.on_failure,
                        type(error).__name__)  # fmt: skip
            if hook.on_failure == "open":
                return None
            return Hit(hook.name, hook.category, hook.action, direction, "hook failed (closed)")
        if not flagged:
            return None
        return Hit(hook.name, category, hook.action, direction, "matched")


def request_text(body: dict[str, Any], *, chat: bool) -> str:
    """The text a client sent: every message's text parts, or the prompt(s), or the
    inputs to embed."""
    if chat:
        return "\n".join(_content_text(m.get("content")) for m in body.get("messages") or ()
                         if isinstance(m, dict))  # fmt: skip
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def answer_text(answer: dict[str, Any]) -> str:
    """Every choice's text in a whole (non-streamed) answer."""
    texts = []
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            texts.append(text if isinstance(text, str) else "")
    return "\n".join(texts)


def event_texts(events: bytes) -> list[str]:
    """The text each choice gained in these SSE events (chat deltas or completion text)."""
    texts = []
    for line in events.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            continue
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str):
                texts.append(text)
    return texts


class StreamScreen:
    """One stream's output checks; ``feed`` each relayed piece, ``finish`` before [DONE]."""

    def __init__(self, screen: Screen) -> None:
        self._screen = screen
        self._lookback = screen.policy.stream_lookback_chars
        self._tail = ""
        self._keep_all = any(isinstance(c, HookCheck) for c in screen.policy.checks_for("output"))
        self._text: list[str] = []
        self._seen: set[str] = set()  # checks already hit: a flag is queued once per stream

    def feed(self, events: bytes) -> list[Hit]:
        new = "".join(event_texts(events))
        if not new:
            return []
        if self._keep_all:
            self._text.append(new)
        window = self._tail + new
        tail = window[-self._lookback :] if self._lookback else ""
        if len(tail) < len(window) and _WORD.match(window[-len(tail) - 1]):
            # Cut mid-word: drop the word's end, or it would match as a word of its own.
            tail = _LEADING_WORD.sub("", tail, count=1)
        self._tail = tail
        return self._fresh(self._screen.pattern_hits("output", window))

    async def finish(self) -> list[Hit]:
        if not self._keep_all:
            return []
        return self._fresh(await self._screen.hook_hits("output", "".join(self._text)))

    def _fresh(self, hits: Sequence[Hit]) -> list[Hit]:
        fresh = [hit for hit in hits if hit.check not in self._seen]
        self._seen.update(hit.check for hit in fresh)
        return sorted(fresh, key=lambda hit: hit.action != "block")


def blocking(hits: Sequence[Hit]) -> Hit | None:
    return next((hit for hit in hits if hit.action == "block"), None)
