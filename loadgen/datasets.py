"""What to send: the prompts of a benchmark run, with exact token lengths.

Prompts are built from words the model's tokenizer encodes as one token each (see
traces.py), so a prompt of N words is N tokens and shared word runs are shared
token runs: the prefix structure a dataset promises is the one the engines see.

- ``random``: independent prompts, input and output lengths uniform in
  [len x (1 - range_ratio), len x (1 + range_ratio)] (vLLM bench's random dataset),
  or log-normal with mean len and sigma range_ratio (``len_dist="lognormal"``: many
  short inputs and a long tail, as search queries and documents mix);
- ``shared-prefix``: ``groups`` system prompts, each followed by
  ``prompts_per_group`` different questions (SGLang's generated-shared-prefix);
- ``multi-turn``: sessions whose every turn is the previous turn's prompt plus a
  new user message, sent ``turn_gap_s`` apart;
- ``mooncake``: a Mooncake-format trace, hash ids turned into fixed word blocks,
  sent on its own timestamps;
- ``jsonl``: your own prompts, one JSON object per line with ``prompt`` (or chat
  ``messages``) and optional ``max_tokens``; for embeddings, ``input``.

For ``/v1/embeddings`` (``embedding_inputs``), a request is a list of
``inputs_per_request`` random inputs, each of its own length.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contracts.tokenization import ModelTokenizer
from loadgen.traces import TRACE_BLOCK_TOKENS, BlockText, read_trace
from loadgen.words import WordSource

DATASETS = ("random", "shared-prefix", "multi-turn", "mooncake", "jsonl")
LENGTH_DISTRIBUTIONS = ("uniform", "lognormal")


@dataclass(frozen=True, slots=True)
class BenchRequest:
    payload: dict  # "prompt" or "messages", and "max_tokens"; or "input" (embeddings)
    input_tokens: int | None
    send_at_s: float | None = None  # set by datasets that carry their own timing


def _length(rng: random.Random, mean: int, range_ratio: float, dist: str = "uniform") -> int:
    if dist == "lognormal":
        # sigma = range_ratio; mu chosen so that the mean is ``mean``.
        sigma = range_ratio
        return max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))
    low, high = int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio))
    return max(1, rng.randint(max(1, low), max(1, high)))


def random_prompts(
    words: WordSource, count: int, *, input_len: int, output_len: int, range_ratio: float = 0.0,
    seed: int = 0, len_dist: str = "uniform",
) -> list[BenchRequest]:  # fmt: skip
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        tokens = _length(rng, input_len, range_ratio, len_dist)
        requests.append(BenchRequest(
            {"prompt": words.run(f"random:{seed}:{index}", tokens),
             "max_tokens": _length(rng, output_len, range_ratio)},
            input_tokens=tokens,
        ))  # fmt: skip
    return requests


def embedding_inputs(
    words: WordSource, count: int, *, input_len: int, range_ratio: float, len_dist: str,
    inputs_per_request: int, max_input_len: int, seed: int = 0,
) -> tuple[list[BenchRequest], int]:  # fmt: skip
    """``count`` requests of ``inputs_per_request`` texts each, and how many lengths
    were cut to ``max_input_len`` (the model's context, less its special tokens)."""
    rng = random.Random(seed)
    requests, cut = [], 0
    for index in range(count):
        texts, tokens = [], 0
        for item in range(inputs_per_request):
            length = _length(rng, input_len, range_ratio, len_dist)
            cut += length > max_input_len
            length = min(length, max_input_len)
            texts.append(words.run(f"embed:{seed}:{index}:{item}", length))
            tokens += length
        requests.append(BenchRequest({"input": texts}, input_tokens=tokens))
    return requests, cut


def shared_prefix_prompts(
    words: WordSource, *, groups: int, prompts_per_group: int, system_len: int,
    question_len: int, output_len: int, seed: int = 0,
) -> list[BenchRequest]:  # fmt: skip
    """Interleaved across groups (g0q0, g1q0, ..., g0q1, ...), as users would arrive."""
    requests = []
    for question in range(prompts_per_group):
        for group in range(groups):
            prompt = words.run(f"system:{seed}:{group}", system_len) + words.run(
                f"question:{seed}:{group}:{question}", question_len
            )
            requests.append(BenchRequest({"prompt": prompt, "max_tokens": output_len},
                                         input_tokens=system_len + question_len))  # fmt: skip
    return requests


def multi_turn_prompts(
    words: WordSource, *, sessions: int, turns: int, first_len: int, turn_len: int,
    output_len: int, session_starts: list[float], turn_gap_s: float, seed: int = 0,
) -> list[BenchRequest]:  # fmt: skip
    """Each turn's prompt is the previous turn's prompt plus a new message."""
    requests = []
    for session in range(sessions):
        prompt = words.run(f"session:{seed}:{session}:0", first_len)
        for turn in range(turns):
            if turn:
                prompt += words.run(f"session:{seed}:{session}:{turn}", turn_len)
            requests.append(BenchRequest(
                {"prompt": prompt, "max_tokens": output_len},
                input_tokens=first_len + turn * turn_len,
                send_at_s=session_starts[session] + turn * turn_gap_s,
            ))  # fmt: skip
    requests.sort(key=lambda r: r.send_at_s or 0.0)
    return requests


def mooncake_prompts(
    tokenizer: ModelTokenizer, path: Path, *, limit: int, speed: float, length_scale: float,
    output_scale: float = 1.0, max_input_tokens: int | None = None,
    on_dropped: Callable[[int], None] | None = None,
) -> list[BenchRequest]:  # fmt: skip
    """``on_dropped`` hears each request left out for ``max_input_tokens`` (its length),
    so a report can count them; they are counted on stderr too."""
    dropped: list[int] = []

    def drop(tokens: int) -> None:
        dropped.append(tokens)
        if on_dropped is not None:
            on_dropped(tokens)

    trace = read_trace(path, speed=speed, length_scale=length_scale, limit=limit,
                       max_input_tokens=max_input_tokens, on_dropped=drop)  # fmt: skip
    if dropped:
        print(f"mooncake: left out {len(dropped)} requests over {max_input_tokens} input tokens",
              file=sys.stderr)  # fmt: skip
    blocks = BlockText(tokenizer, block_tokens=max(1, int(TRACE_BLOCK_TOKENS / length_scale)))
    return [
        BenchRequest(
            {"prompt": blocks.prompt(r),
             "max_tokens": max(1, round(r.output_tokens * length_scale / output_scale))},
            input_tokens=r.input_tokens, send_at_s=r.send_at_s,
        )
        for r in trace
    ]  # fmt: skip


def jsonl_prompts(path: Path, *, limit: int | None, default_output_len: int) -> list[BenchRequest]:
    requests = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            raw = json.loads(line)
            if not isinstance(raw, dict) or not ({"prompt", "messages", "input"} & raw.keys()):
                raise ValueError(f"{path}:{number}: needs a 'prompt', 'messages' or 'input' field")
            payload = {k: raw[k] for k in ("prompt", "messages", "input") if k in raw}
            if "input" not in payload:
                payload["max_tokens"] = int(raw.get("max_tokens", default_output_len))
            requests.append(BenchRequest(payload, input_tokens=None))
            if limit is not None and len(requests) >= limit:
                break
    return requests
