"""Timing profiles: how long an engine step and a KV transfer take, by batch shape.

One engine step runs every running decode (one token each) plus prefill chunks
that fit the token budget. Its time is modelled as

    step_ms = floor_ms
            + prefill_ms_per_token     * prefill_tokens
            + prefill_ms_per_context   * cached_context_tokens_attended_by_prefills / 1000
            + prefill_ms_per_kpair     * attention_pairs / 1000
            + decode_ms_per_seq        * decode_seqs
            + decode_ms_per_kv_ktoken  * decode_context_tokens / 1000

where ``attention_pairs`` sums, over the step's prefill chunks, chunk tokens x the
tokens each attends to (its context plus half the chunk): the quadratic part of
prefill, which makes one long prompt cost more than several short ones. Plus
``request_overhead_ms`` once per request before it is queued (the API
server's own work, which real vLLM pays outside the engine loop). A KV transfer
takes ``transfer_overhead_ms + bytes / bandwidth``. Profiles are JSON files in
``sim/profiles/``; each names the measurement or publication its numbers come from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
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

    def __post_init__(self) -> None:
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
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_seqs: int,
        decode_context_tokens: int,
        prefill_attention_pairs: float = 0.0,
    ) -> float:
        ms = (
            self.floor_ms
            + self.prefill_ms_per_token * prefill_tokens
            + self.prefill_ms_per_context * prefill_context_tokens / 1000
            + self.prefill_ms_per_kpair * prefill_attention_pairs / 1000
            + self.decode_ms_per_seq * decode_seqs
            + self.decode_ms_per_kv_ktoken * decode_context_tokens / 1000
        )
        return ms / 1000

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
