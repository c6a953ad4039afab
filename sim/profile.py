"""Timing profiles: how long an engine step and a KV transfer take, by batch shape.

One engine step runs every running decode (one token each) plus prefill chunks
that fit the token budget. Its time is modelled as

    step_ms = floor_ms
            + sum over the step's prefill chunks of prefill_chunk_ms(chunk, context)
            + decode_ms_per_seq        * decode_seqs
            + decode_ms_per_kv_ktoken  * decode_context_tokens / 1000

    prefill_chunk_ms(chunk, context) = fresh_ms(chunk)
            + prefill_ms_per_context * context / 1000
            + prefill_ms_per_kpair   * chunk * context / 1000

where ``context`` is the chunk's cached or earlier-computed tokens, and ``fresh_ms``
is the cost of prefilling ``chunk`` tokens with nothing before them:
- with a measured ``prefill_ms_curve`` (points (tokens, ms), as `pdserve sim
  calibrate` records them), the curve, linear between points and past the last one
  continued at ``prefill_ms_per_token``. Real vLLM on CPU is neither linear nor
  quadratic in prompt length (its cost jumps between 512 and 1024 tokens), so
  a measured curve is what keeps a CPU profile close;
- otherwise ``prefill_ms_per_token * chunk + prefill_ms_per_kpair * chunk^2 / 2000``:
  linear work plus the attention pairs among the chunk's own tokens (the quadratic
  part, which makes one long prompt cost more than several short ones).

Plus ``request_overhead_ms`` once per request before it is queued (the API
server's own work, which real vLLM pays outside the engine loop). A KV transfer
takes ``transfer_overhead_ms + bytes / bandwidth``. Profiles are JSON files in
``sim/profiles/``; each names the measurement or publication its numbers come from.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import pairwise
from pathlib import Path

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingProfile:
    name: str
    source: str
    block_size_tokens: int
    kv_capacity_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    request_overhead_ms: float  # per request, outside the engine step (HTTP, tokenizer)
    floor_ms: float
    prefill_ms_per_token: float
    prefill_ms_per_context: float
    decode_ms_per_seq: float
    decode_ms_per_kv_ktoken: float
    kv_bytes_per_token: int
    transfer_gbytes_per_s: float
    transfer_overhead_ms: float
    prefill_ms_per_kpair: float = 0.0
    # The hardware modelled, as the cost model names worker kinds ("cpu", "nvidia-h100").
    accelerator: str = "cpu"
    # Measured (prompt tokens, ms) points of one fresh prefill: tokens rising, ms not falling.
    prefill_ms_curve: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        curve = tuple((int(tokens), float(ms)) for tokens, ms in self.prefill_ms_curve)
        object.__setattr__(self, "prefill_ms_curve", curve)  # JSON gives lists
        if any(b[0] <= a[0] or b[1] < a[1] for a, b in pairwise(curve)) or any(
            tokens <= 0 or ms < 0 for tokens, ms in curve
        ):
            raise ValueError(f"profile {self.name}: prefill_ms_curve must increase (ms: not fall)")
        if self.block_size_tokens <= 0 or self.kv_capacity_tokens < self.block_size_tokens:
            raise ValueError(f"profile {self.name}: KV capacity must hold at least one block")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(f"profile {self.name}: batch limits must be positive")

    @property
    def num_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size_tokens

    def step_s(
        self,
        *,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_seqs: int,
        decode_context_tokens: int,
    ) -> float:
        """One step: ``prefill_chunks`` as (new tokens, context tokens) per request."""
        ms = (
            self.floor_ms
            + sum(self.prefill_chunk_ms(chunk, context) for chunk, context in prefill_chunks)
            + self.decode_ms_per_seq * decode_seqs
            + self.decode_ms_per_kv_ktoken * decode_context_tokens / 1000
        )
        return ms / 1000

    def prefill_chunk_ms(self, tokens: int, context_tokens: int = 0) -> float:
        return (
            self._fresh_prefill_ms(tokens)
            + self.prefill_ms_per_context * context_tokens / 1000
            + self.prefill_ms_per_kpair * tokens * context_tokens / 1000
        )

    def _fresh_prefill_ms(self, tokens: int) -> float:
        curve = self.prefill_ms_curve
        if not curve:
            return self.prefill_ms_per_token * tokens + self.prefill_ms_per_kpair * (
                tokens * tokens / 2000
            )
        at = bisect_left(curve, (tokens, -1.0))
        if at == len(curve):
            last_tokens, last_ms = curve[-1]
            return last_ms + self.prefill_ms_per_token * (tokens - last_tokens)
        right_tokens, right_ms = curve[at]
        left_tokens, left_ms = curve[at - 1] if at else (0, 0.0)
        share = (tokens - left_tokens) / (right_tokens - left_tokens)
        return left_ms + share * (right_ms - left_ms)

    def transfer_s(self, tokens: int) -> float:
        seconds = tokens * self.kv_bytes_per_token / (self.transfer_gbytes_per_s * 1e9)
        return self.transfer_overhead_ms / 1000 + seconds


def load_profile(name_or_path: str) -> TimingProfile:
    """A profile by name (``sim/profiles/NAME.json``) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.exists():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.json"))
        raise ValueError(f"no timing profile {name_or_path!r}; known: {known}")
    raw = json.loads(path.read_text())
    allowed = {f.name for f in fields(TimingProfile)}
    unknown = set(raw) - allowed - {"notes"}
    if unknown:
        raise ValueError(f"profile {path.name}: unknown keys {sorted(unknown)}")
    return TimingProfile(**{k: v for k, v in raw.items() if k in allowed})
