"""A route's safety policy: the checks run on a request's input and on the model's output.

Each check has an ``action``: ``block`` (input: a 400 before any worker sees the request;
output: the answer is withheld, or a stream ends with an error event) or ``flag`` (served,
and queued for the reviewer). Two kinds:
- ``patterns``: regular expressions and a blocklist of words or phrases (whole words,
  case-insensitive), run in the router;
- ``http``: a classifier service. The router POSTs ``{"text", "direction", "check",
  "model"}`` and reads ``{"flagged": bool, "category": str | null}``. Past ``timeout_s``
  or on any failure, ``on_failure`` decides: ``open`` passes the text, ``closed`` treats
  it as flagged.

On a stream, pattern checks run on each event's new text plus the last
``stream_lookback_chars`` before it, so a match up to that long is caught even when it
spans events, at a cost bounded by that window per event. HTTP checks on a stream run
once, on the whole text, before ``[DONE]`` is relayed.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

Action = Literal["block", "flag"]
Direction = Literal["input", "output"]
AppliesTo = Literal["input", "output", "both"]
_CHECK_NAME = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$"


class _Check(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_CHECK_NAME)
    category: str = Field("policy", pattern=_CHECK_NAME, description="reported to reviewers")
    action: Action = "block"
    applies_to: AppliesTo = "both"

    def applies(self, direction: Direction) -> bool:
        return self.applies_to in (direction, "both")


class PatternCheck(_Check):
    kind: Literal["patterns"] = "patterns"
    patterns: tuple[str, ...] = Field((), max_length=256, description="regexes, any case")
    blocklist: tuple[str, ...] = Field((), max_length=10_000, description="words or phrases")

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            if len(pattern) > 1000:
                raise ValueError("a pattern is over 1000 characters")
            try:
                re.compile(pattern, re.IGNORECASE)
            except re.error as error:
                raise ValueError(f"pattern {pattern[:60]!r} does not compile: {error}") from None
        return patterns

    @field_validator("blocklist")
    @classmethod
    def _words(cls, words: tuple[str, ...]) -> tuple[str, ...]:
        if any(not word.strip() or len(word) > 200 for word in words):
            raise ValueError("blocklist entries are 1..200 characters, not blank")
        return words


class HookCheck(_Check):
    kind: Literal["http"] = "http"
    url: str = Field(pattern=r"^https?://", max_length=500)
    timeout_s: float = Field(0.5, gt=0, le=10)
    on_failure: Literal["open", "closed"] = "open"


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "patterns"))
    return str(getattr(value, "kind", "patterns"))


# ``kind`` may be left out for a pattern check.
SafetyCheck = Annotated[
    Annotated[PatternCheck, Tag("patterns")] | Annotated[HookCheck, Tag("http")],
    Discriminator(_kind),
]


class SafetyPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    checks: tuple[SafetyCheck, ...] = Field((), max_length=32)
    # A flagged item keeps the prompt's text only when this says so, and only this long.
    keep_prompt: bool = False
    prompt_retention_s: float = Field(86_400.0, gt=0, le=30 * 86_400)
    stream_lookback_chars: int = Field(256, ge=0, le=4096)

    def checks_for(self, direction: Direction) -> tuple[SafetyCheck, ...]:
        return tuple(check for check in self.checks if check.applies(direction))
