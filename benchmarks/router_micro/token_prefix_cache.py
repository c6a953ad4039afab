"""The router's token prefix cache against plain tokenizing, side by side in one run.

Per tokenizer and prompt size, CPU milliseconds per prompt (the thread's own time,
median of ``--rounds`` rounds of ``--prompts`` prompts each), each cell beside plain
``encode`` on the same prompts in the same round:
- ``new``: every prompt new text, so the cache only costs (cuts, hashing, storing);
- ``system``: one long shared system prompt then a new ~50-word question (the cache
  warmed by the first prompt of the round only);
- ``turns``: a conversation, each prompt the previous one plus a ~50-word turn.
Every cached result is checked equal to plain ``encode`` (a mismatch stops the run).

    python -m benchmarks.router_micro.token_prefix_cache [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from contracts.machine import machine_record
from contracts.tokenization import ModelTokenizer, load_tokenizer
from modelstore import tiny_llama
from router.prepare.token_prefix_cache import TokenPrefixCache

WORDS = [
    "the", "router", "prefill", "decode", "cache,", "tokens.", "Mooncake", "42", "serving",
    "latency", "naïve", "東京", "(p99)", "--",
]  # fmt: skip


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def workloads(rng: random.Random, size_words: int, prompts: int) -> dict[str, list[str]]:
    system = words(rng, size_words)
    turns, text = [], words(rng, size_words)
    for _ in range(prompts):
        text += " " + words(rng, 50)
        turns.append(text)
    return {
        "new": [words(rng, size_words) for _ in range(prompts)],
        "system": [system + " Q: " + words(rng, 50) for _ in range(prompts)],
        "turns": turns,
    }


def cpu_ms_each(encode: Callable[[str], list[int]], texts: list[str]) -> tuple[float, list]:
    started = time.thread_time()
    out = [encode(text) for text in texts]
    return (time.thread_time() - started) * 1000 / len(texts), out


def measure(tokenizer: ModelTokenizer, args: argparse.Namespace) -> list[dict]:
    rows = []
    for size in args.sizes:
        per_round: dict[str, list[tuple[float, float]]] = {}
        for round_ in range(args.rounds):
            rng = random.Random(round_ * 1000 + size)
            for name, texts in workloads(rng, size, args.prompts).items():
                cache = TokenPrefixCache(max_tokens=args.cache_tokens, stride_chars=args.stride)
                sides = {
                    "plain": lambda t: tokenizer.encode(t, add_special_tokens=True),
                    "cached": lambda t, c=cache: c.encode(tokenizer, t, add_special_tokens=True)[0],
                }
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]  # either first
                measured = {side: cpu_ms_each(sides[side], texts) for side in order}
                (plain_ms, plain), (cached_ms, cached) = measured["plain"], measured["cached"]
                if cached != plain:
                    sys.exit(f"cached ids differ from the tokenizer's ({name}, {size} words)")
                per_round.setdefault(name, []).append((plain_ms, cached_ms))
        tokens = len(tokenizer.encode(words(random.Random(0), size), add_special_tokens=True))
        for name, pairs in per_round.items():
            plain_ms = statistics.median(p for p, _ in pairs)
            cached_ms = statistics.median(c for _, c in pairs)
            rows.append({
                "workload": name, "words": size, "tokens_about": tokens,
                "plain_ms": round(plain_ms, 3), "cached_ms": round(cached_ms, 3),
                "cached_over_plain": round(cached_ms / plain_ms, 3),
                "per_round": [[round(p, 3), round(c, 3)] for p, c in pairs],
            })  # fmt: skip
            print(f"  {name:6} ~{tokens:6} tokens: plain {plain_ms:7.2f} ms, cached "
                  f"{cached_ms:7.2f} ms ({cached_ms / plain_ms:.2f}x)", flush=True)  # fmt: skip
    return rows


def plot(results: dict[str, list[dict]], path: Path) -> None:
    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for axis, (model, rows) in zip(axes[0], results.items(), strict=True):
        for name in ("new", "system", "turns"):
            mine = [r for r in rows if r["workload"] == name]
            axis.plot([r["tokens_about"] for r in mine], [r["cached_over_plain"] for r in mine],
                      marker="o", label=name)  # fmt: skip
        axis.axhline(1.0, color="grey", linestyle=":")
        axis.set_xscale("log")
        axis.set_xlabel("prompt tokens (about)")
        axis.set_ylabel("cached / plain CPU per prompt")
        axis.set_title(model)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 8000])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stride", type=int, default=1024)
    parser.add_argument("--cache-tokens", type=int, default=1_000_000)
    parser.add_argument("--model", action="append", default=[],
                        help="more tokenizer folders to measure (tiny-llama always)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    results = {}
    for folder in [str(tiny_llama.ensure()), *args.model]:
        print(f"{folder}:", flush=True)
        results[Path(folder).name] = measure(load_tokenizer(folder), args)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.router_micro.token_prefix_cache " + " ".join(
        argv or sys.argv[1:]
    )
    (args.out / "token_prefix_cache.json").write_text(json.dumps(
        {"command": command.strip(), "date": time.strftime("%F %T"),
         "machine": machine_record(), "settings": {k: str(v) for k, v in vars(args).items()},
         "results": results}, indent=1))  # fmt: skip
    plot(results, args.out / "token_prefix_cache.png")
    print(f"wrote {args.out / 'token_prefix_cache.json'} and .png")


if __name__ == "__main__":
    main()
