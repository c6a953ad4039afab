"""How many tokens the unread rest of a long prompt has, at least, judged from its head.

Admission may refuse a long prompt after tokenizing only its head (``prepare.measure_head``):
the rest's tokens are estimated from the head's tokens per character, times a *share*
that keeps the estimate on the low side. A fixed share has to suit every kind of text
(prose, code, tables), so it is low for most traffic and the head bound rarely decides.
Here the share is learned from the model's own traffic: every prompt whose head was
measured and which was then tokenized whole gives one ratio, the rest's tokens per
character over the head's. The share is a low quantile of the latest ratios.

Invariants:
- at most ``max_samples`` ratios are kept, newest last; with fewer than ``min_samples``
  the share is the prior;
- the share never exceeds 1: the estimate is never above the head's own density;
- with ``max_samples`` 0 nothing is learned and the share is always the prior.

Pure state, one event loop owns it.
"""

from __future__ import annotations

import math
from collections import deque

# Used until enough prompts were measured: mixed prose and code measured 0.77-1.2
# (rest over head, 4k-character heads), so 0.8 is under nearly all of it.
PRIOR_SHARE = 0.8
# Low enough that about one prompt in a hundred has a sparser rest than estimated: those
# are the ones a head refusal could wrongly turn away, and only when already near late.
QUANTILE = 0.01
MIN_SAMPLES = 32


class RestDensity:
    def __init__(self, *, max_samples: int, min_samples: int = MIN_SAMPLES) -> None:
        if max_samples < 0 or min_samples < 1:
            raise ValueError("max_samples must be >= 0 and min_samples >= 1")
        self._ratios: deque[float] = deque(maxlen=max_samples or 1)
        self._learning = max_samples > 0
        self._min_samples = min(min_samples, max_samples) if max_samples else min_samples
        self._share: float | None = None  # cached until the next sample

    def __repr__(self) -> str:
        return f"RestDensity(samples={len(self)}, share={self.share():.3f})"

    def __len__(self) -> int:
        return len(self._ratios)  # observe() keeps nothing while not learning

    def observe(
        self, *, head_tokens: int, head_chars: int, rest_tokens: int, rest_chars: int
    ) -> None:
        """One prompt measured both ways: its head, then the whole."""
        if not self._learning or min(head_tokens, head_chars, rest_chars) <= 0:
            return
        if rest_tokens < 0:
            return  # the whole tokenized shorter than its head: a template cut, not text
        self._ratios.append((rest_tokens / rest_chars) / (head_tokens / head_chars))
        self._share = None

    def share(self) -> float:
        """What fraction of the head's tokens per character the rest is assumed to have."""
        if len(self) < self._min_samples:
            return PRIOR_SHARE
        if self._share is None:
            ordered = sorted(self._ratios)
            self._share = min(1.0, ordered[math.floor(QUANTILE * (len(ordered) - 1))])
        return self._share
