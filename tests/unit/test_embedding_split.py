"""Cutting a large embeddings request and merging the pieces' answers back into one."""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from router.orchestration.embedding_split import _merge_parsed, merge_answers, split_points


@pytest.mark.parametrize(
    ("count", "workers", "min_inputs", "sizes"),
    [
        (100, 2, 32, [50, 50]),
        (101, 3, 32, [34, 34, 33]),  # 3 pieces of >= 32
        (100, 4, 32, [34, 33, 33]),  # not 4: a piece would hold 25
        (63, 2, 32, [63]),  # too few to cut
        (100, 1, 32, [100]),  # nobody to share with
        (100, 4, 0, [100]),  # 0: never cut
    ],
)  # fmt: skip
def test_pieces_are_contiguous_balanced_and_big_enough(count, workers, min_inputs, sizes):
    slices = split_points(count, workers, min_inputs)
    assert [s.stop - s.start for s in slices] == sizes
    assert slices[0].start == 0 and slices[-1].stop == count
    assert all(a.stop == b.start for a, b in itertools.pairwise(slices))


def answer(first: int, count: int, tokens: int, *, b64: bool = False) -> bytes:
    """An answer as vLLM writes it: compact, ``data`` then ``usage`` last."""
    data = []
    for index in range(count):
        vector = [float(first + index), -0.5]
        embedding = base64.b64encode(bytes(8)).decode() if b64 else vector
        data.append({"index": index, "object": "embedding", "embedding": embedding})
    body = {"id": f"embd-{first}", "object": "list", "created": 7, "model": "m", "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None}}  # fmt: skip
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize("b64", [False, True], ids=["float", "base64"])
def test_the_merged_answer_is_one_engines_answer(b64):
    pieces = [answer(0, 3, 30, b64=b64), answer(3, 2, 12, b64=b64), answer(5, 4, 9, b64=b64)]
    merged = json.loads(merge_answers(pieces, [0, 3, 5]))
    assert [item["index"] for item in merged["data"]] == list(range(9))
    if not b64:  # each vector kept its place
        assert [item["embedding"][0] for item in merged["data"]] == list(range(9))
    assert merged["usage"] == {"prompt_tokens": 51, "total_tokens": 51, "completion_tokens": 0,
                               "prompt_tokens_details": None}  # fmt: skip
    assert merged["id"] == "embd-0" and merged["model"] == "m" and merged["object"] == "list"
    assert merged == json.loads(_merge_parsed(pieces, [0, 3, 5]))


def test_an_answer_of_another_shape_is_merged_by_parsing():
    """``usage`` before ``data`` (not vLLM's order): the byte merge would be wrong."""
    reordered = []
    for raw in (answer(0, 2, 5), answer(2, 2, 6)):
        body = json.loads(raw)
        reordered.append(json.dumps({"usage": body.pop("usage"), **body}).encode())
    merged = json.loads(merge_answers(reordered, [0, 2]))
    assert [item["index"] for item in merged["data"]] == [0, 1, 2, 3]
    assert merged["usage"]["prompt_tokens"] == 11
