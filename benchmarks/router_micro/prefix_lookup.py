"""What the router spends per request on the prefix: hashing a prompt's blocks and one
index lookup, for a 4k-token prompt (ARCHITECTURE budget: under 0.2 ms together).

Measured side by side in one run, median of many repetitions:
- hashing the whole chain cold (every block new) and memoized (a repeated prefix),
  per algorithm;
- ``PrefixIndex.match`` on an index holding ``--index-blocks`` blocks over
  ``--workers`` workers, for a prompt fully held by one worker (the deepest walk);
- the router's lookup as it runs (``PromptBlocks``: hashing only as deep as the index
  matches): a prompt one worker holds whole (memoized walk), and a new prompt whose
  first block only is held everywhere (hashes two blocks). The new prompt's other
  blocks are hashed afterwards, for the chosen worker's record: ``hash_cold_ms``.

    python -m benchmarks.router_micro.prefix_lookup [--tokens 4096] [--out benchmarks/results]
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

from contracts.block_hashing import (
    HASH_FUNCTIONS,
    MemoizedBlockHasher,
    block_hashes,
    external_block_hash,
    none_hash,
)
from contracts.machine import machine_record
from router.prepare.prompt_blocks import PromptBlocks
from router.scheduling.prefix_index import PrefixIndex


def median_ms(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(block_size: int, name: str, args: argparse.Namespace, rng: random.Random) -> dict:
    hash_fn = HASH_FUNCTIONS[name]
    root = none_hash(hash_fn)
    prompts = [[rng.randrange(32000) for _ in range(args.tokens)] for _ in range(args.repeats)]
    fresh = iter(prompts)
    cold = median_ms(lambda: block_hashes(next(fresh), block_size, hash_fn, root), args.repeats)
    hasher = MemoizedBlockHasher(hash_fn, root)
    hasher(prompts[0], block_size)
    memo = median_ms(lambda: hasher(prompts[0], block_size), args.repeats)
    index = PrefixIndex(max_blocks=args.index_blocks + 1000)
    for filler in range(args.index_blocks // 100):
        index.confirm(f"w{filler % args.workers}", [rng.getrandbits(64) for _ in range(100)])
    held = [external_block_hash(h) for h in block_hashes(prompts[0], block_size, hash_fn, root)]
    index.confirm("w0", held)
    for other in range(1, args.workers):  # the shared system-prompt block is everywhere
        index.confirm(f"w{other}", held[:1])
    lookup = median_ms(lambda: index.match(held, 0.0), args.repeats)

    def route(prompt: list[int]) -> dict[str, int]:
        return index.match(PromptBlocks(len(prompt), block_size, hasher.lazy(prompt, block_size))
                           .leading(), 0.0)  # fmt: skip

    assert route(prompts[0]) == index.match(held, 0.0)
    route_held = median_ms(lambda: route(prompts[0]), args.repeats)
    shared_first = [prompts[0][:block_size] + p[block_size:] for p in prompts]
    new = iter(shared_first)
    route_new = median_ms(lambda: route(next(new)), args.repeats)
    print(f"block {block_size:4d} {name:12s} hash cold {cold:.3f} ms, memoized "
          f"{memo:.3f} ms; match {lookup:.3f} ms ({len(held)} blocks); routing lookup: "
          f"held {route_held:.3f} ms, new {route_new:.3f} ms")  # fmt: skip
    return {
        "block_size": block_size, "algorithm": name, "blocks": len(held),
        "hash_cold_ms": cold, "hash_memoized_ms": memo, "index_match_ms": lookup,
        "total_cold_ms": cold + lookup, "total_memoized_ms": memo + lookup,
        "routing_lookup_held_ms": route_held, "routing_lookup_new_ms": route_new,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--index-blocks", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    rng = random.Random(0)
    rows = [measure(block_size, name, args, rng)
            for block_size in args.block_sizes for name in HASH_FUNCTIONS]  # fmt: skip
    report = {
        "command": "python -m benchmarks.router_micro.prefix_lookup " + " ".join(sys.argv[1:]),
        "date": time.strftime("%F %T"),
        "machine": machine_record(),
        "prompt_tokens": args.tokens,
        "index_blocks": args.index_blocks,
        "workers": args.workers,
        "budget_ms": 0.2,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix_lookup.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}/prefix_lookup.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
