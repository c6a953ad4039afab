"""Prompt lists and n > 1: split into single-choice calls, merged back as vLLM answers."""

from __future__ import annotations

import json

import pytest
from fastapi.responses import Response, StreamingResponse

from router.errors import InvalidRequest
from router.prepare.fan_out import serve_choices, split_choices


@pytest.mark.parametrize(
    ("body", "prompts", "counted"),
    [
        ({"prompt": "a"}, None, None),
        ({"prompt": [1, 2, 3]}, None, None),
        ({"prompt": ["a"]}, ["a"], [True]),
        ({"prompt": [[1, 2]]}, [[1, 2]], [True]),
        ({"prompt": ["a", "b"]}, ["a", "b"], [True, True]),
        ({"prompt": [[1], [2, 3]], "n": 2}, [[1], [1], [2, 3], [2, 3]], [True, False] * 2),
        ({"prompt": "a", "n": 3}, ["a", "a", "a"], [True, False, False]),
    ],
)
def test_split_follows_vllms_choice_order(body, prompts, counted):
    choices = split_choices(body, chat=False, max_choices=16)
    if prompts is None:
        assert choices is None
        return
    assert [c.body["prompt"] for c in choices] == prompts
    assert [c.counts_prompt for c in choices] == counted
    assert {c.body.get("n", 1) for c in choices} == {1}


def test_seeded_samples_get_vllms_child_seeds_and_greedy_n_is_refused():
    choices = split_choices({"prompt": ["a", "b"], "n": 2, "seed": 7}, chat=False, max_choices=16)
    assert [c.body["seed"] for c in choices] == [7, 8, 7, 8]
    with pytest.raises(InvalidRequest, match="greedy"):
        split_choices({"prompt": "a", "n": 2, "temperature": 0}, chat=False, max_choices=16)


def test_chat_splits_by_n_and_the_cap_is_a_400():
    assert len(split_choices({"messages": [], "n": 4}, chat=True, max_choices=16)) == 4
    assert split_choices({"messages": []}, chat=True, max_choices=16) is None
    with pytest.raises(InvalidRequest):
        split_choices({"prompt": ["a", "b"], "n": 9}, chat=False, max_choices=16)


def whole(text: str, prompt_tokens: int, completion_tokens: int) -> Response:
    payload = {"id": f"cmpl-{text}", "object": "text_completion", "model": "m",
               "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}}  # fmt: skip
    return Response(content=json.dumps(payload), media_type="application/json")


async def test_whole_answers_merge_with_indexes_and_usage_as_vllm_counts_it():
    choices = split_choices({"prompt": ["ab", "c"], "n": 2}, chat=False, max_choices=16)
    served = iter([whole("w", 2, 3), whole("x", 2, 3), whole("y", 1, 4), whole("z", 1, 4)])

    async def serve(body, counts_prompt):
        return next(served)

    merged = json.loads((await serve_choices(choices, serve, stream=False,
                                             include_usage=False)).body)  # fmt: skip
    assert [(c["index"], c["text"]) for c in merged["choices"]] == [
        (0, "w"), (1, "x"), (2, "y"), (3, "z")
    ]  # fmt: skip
    # Each prompt's tokens once (2 + 1), every output (3 + 3 + 4 + 4).
    assert merged["usage"] == {"prompt_tokens": 3, "completion_tokens": 14, "total_tokens": 17}


def stream_of(text: str, closed: list[str]) -> StreamingResponse:
    async def events():
        try:
            for token in text:
                chunk = {"id": f"cmpl-{text}", "choices": [{"index": 0, "text": token}]}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            usage = {"prompt_tokens": 2, "completion_tokens": len(text), "total_tokens": 0}
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            closed.append(text)

    return StreamingResponse(events(), media_type="text/event-stream")


async def test_streams_interleave_under_one_id_with_one_usage_chunk_and_one_done():
    closed: list[str] = []
    choices = split_choices({"prompt": ["p", "q"]}, chat=False, max_choices=16)
    streams = iter([stream_of("abc", closed), stream_of("de", closed)])

    async def serve(body, counts_prompt):
        assert body["stream_options"]["include_usage"] is True
        return next(streams)

    response = await serve_choices(choices, serve, stream=True, include_usage=True)
    events = [e async for e in response.body_iterator]
    data = [e[6:].strip() for e in events]
    assert data[-1] == b"[DONE]" and data.count(b"[DONE]") == 1
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "abc", 1: "de"}
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert sorted(closed) == ["abc", "de"]


async def test_an_error_event_ends_the_merged_stream_and_closes_every_call():
    closed: list[str] = []

    def failing() -> StreamingResponse:
        async def events():
            try:
                yield b'event: error\ndata: {"error": {"message": "decode died"}}\n\n'
            finally:
                closed.append("failing")

        return StreamingResponse(events(), media_type="text/event-stream")

    choices = split_choices({"prompt": "p", "n": 2}, chat=False, max_choices=16)
    streams = iter([failing(), stream_of("abcdef", closed)])

    async def serve(body, counts_prompt):
        return next(streams)

    response = await serve_choices(choices, serve, stream=True, include_usage=False)
    events = [e async for e in response.body_iterator]
    assert events[-1].startswith(b"event: error")
    assert all(b"[DONE]" not in e for e in events)
    assert sorted(closed) == ["abcdef", "failing"]
