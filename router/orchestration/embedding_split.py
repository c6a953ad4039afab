"""One large ``/v1/embeddings`` request, cut across idle embedding workers and merged.

An embedding engine works through a request's inputs on its own cores; with other
workers idle, a list of hundreds of inputs finishes sooner in contiguous pieces, one
per idle worker. Under load nothing is idle and nothing is cut: splitting then only
adds the merge (benchmarks/embeddings.py measures both).

Invariants:
- pieces are contiguous and in order, none is empty, and each holds at least
  ``min_inputs`` inputs (so there are at most ``len(inputs) // min_inputs`` of them);
- the merged answer is the one a single engine gives: every item's ``index`` is its
  position in the whole request, ``usage`` adds the pieces' counts, and the rest (id,
  model, created) is the first piece's.

The merge works on the answers' bytes: parsing megabytes of floats to renumber a few
indices would cost the router tens of milliseconds per piece. It relies on what
vLLM writes (``data`` then ``usage``, last); an answer of another shape is merged by
parsing it, slowly but right.
"""

from __future__ import annotations

import json
import re

_DATA_OPEN = re.compile(rb'"data"\s*:\s*\[')
_INDEX = re.compile(rb'"index"\s*:\s*(\d+)')
_USAGE = b'"usage"'


def split_points(count: int, workers: int, min_inputs: int) -> list[slice]:
    """Contiguous, balanced slices of ``count`` inputs, for at most ``workers``
    pieces of at least ``min_inputs`` each; one slice when cutting does not pay."""
    pieces = min(workers, count // min_inputs) if min_inputs > 0 else 1
    pieces = max(1, pieces)
    size, extra = divmod(count, pieces)
    slices, start = [], 0
    for piece in range(pieces):
        end = start + size + (piece < extra)
        slices.append(slice(start, end))
        start = end
    return slices


def merge_answers(answers: list[bytes], offsets: list[int]) -> bytes:
    """One answer from the pieces' answers; ``offsets[i]``: piece i's first input's index."""
    try:
        return _merge_bytes(answers, offsets)
    except ValueError:
        return _merge_parsed(answers, offsets)


def _merge_bytes(answers: list[bytes], offsets: list[int]) -> bytes:
    items, prompt, total = [], 0, 0
    head = usage_object = b""
    for answer, offset in zip(answers, offsets, strict=True):
        opened = _DATA_OPEN.search(answer)
        usage_at = answer.rfind(_USAGE)
        if opened is None or usage_at < opened.end():
            raise ValueError("not data then usage")
        close = answer.rfind(b"]", opened.end(), usage_at)
        usage = json.loads(b"{" + answer[usage_at:])["usage"]  # ValueError if not last
        prompt += usage.get("prompt_tokens", 0)
        total += usage.get("total_tokens", 0)
        body = answer[opened.end() : close].strip()
        if body:
            items.append(_INDEX.sub(lambda m, o=offset: b'"index":%d' % (int(m[1]) + o), body))
        if not head:
            head, usage_object = answer[: opened.end()], usage
    usage_object = {**usage_object, "prompt_tokens": prompt, "total_tokens": total}
    usage_bytes = json.dumps(usage_object, separators=(",", ":")).encode()
    return head + b",".join(items) + b'],"usage":' + usage_bytes + b"}"


def _merge_parsed(answers: list[bytes], offsets: list[int]) -> bytes:
    parsed = [json.loads(answer) for answer in answers]
    merged = dict(parsed[0])
    merged["data"] = [
        {**item, "index": item["index"] + offset}
        for answer, offset in zip(parsed, offsets, strict=True)
        for item in answer["data"]
    ]
    usage = dict(merged.get("usage") or {})
    for key in ("prompt_tokens", "total_tokens"):
        usage[key] = sum((answer.get("usage") or {}).get(key, 0) for answer in parsed)
    merged["usage"] = usage
    return json.dumps(merged, separators=(",", ":")).encode()
