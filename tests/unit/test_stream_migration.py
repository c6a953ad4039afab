"""A stream's transcript: what the client sees of it, and where a continuation starts."""

from __future__ import annotations

import json

import pytest

from router.orchestration.migration import (
    ContinuationDiverged,
    ResumeMode,
    Transcript,
    resume_mode,
)
from router.orchestration.relay import SSERelay, StreamStats
from router.prepare.prepare import Endpoint, PreparedRequest


def request(
    stream: bool = True, endpoint: Endpoint = Endpoint.COMPLETIONS, **body
) -> PreparedRequest:
    body = {"model": "m", "prompt": "hi", "max_tokens": 10, "stream": stream, **body}
    return PreparedRequest(endpoint=endpoint, body=body, model="m", stream=stream,
                           arrived_s=0.0, requested_model="m", max_output_tokens=10)  # fmt: skip


def event(text: str, ids: list[int], prompt_ids: list[int] | None = None, **extra) -> bytes:
    """A vLLM completion chunk, compact as vLLM writes it."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None,
              "stop_reason": None, "prompt_token_ids": prompt_ids, "token_ids": ids}  # fmt: skip
    chunk = {"id": "cmpl-first", "object": "text_completion", "created": 1, "model": "m",
             "choices": [choice], **extra}  # fmt: skip
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def transcript_of(
    prepared: PreparedRequest, mode: ResumeMode, max_bytes: int = 1 << 20
) -> Transcript:
    return Transcript(prepared, mode, client_wants_ids=False, max_bytes=max_bytes)


@pytest.mark.parametrize(
    ("body", "mode"),
    [({"temperature": 0}, ResumeMode.CONTINUE),
     ({"temperature": 0.7, "seed": 3}, ResumeMode.REPLAY),
     ({"temperature": 0.7}, None), ({}, None), ({"temperature": 0, "n": 2}, None),
     ({"temperature": 0, "logprobs": 2}, None),
     # Text held back for a stop string: replayed from the start, never continued.
     ({"temperature": 0, "stop": ["\n"]}, ResumeMode.REPLAY),
     ({"temperature": 0.7, "seed": 3, "stop": "x"}, ResumeMode.REPLAY),
     ({"temperature": 0, "prompt": ["a", "b"]}, None),
     # A grammar's state: rebuilt only by a run from the start.
     ({"temperature": 0, "response_format": {"type": "json_object"}}, ResumeMode.REPLAY),
     ({"temperature": 0, "structured_outputs": {"regex": "[a-z]+"}}, ResumeMode.REPLAY),
     ({"temperature": 0.7, "response_format": {"type": "json_object"}}, None)],
)  # fmt: skip
def test_only_requests_whose_answer_is_fixed_are_continued(body, mode):
    assert resume_mode(request(**body)) is mode
    assert resume_mode(request(stream=False, **body)) is None
    chat = {k: v for k, v in body.items() if k != "prompt"}
    chat_mode = mode if "prompt" not in body else ResumeMode.CONTINUE
    assert resume_mode(request(endpoint=Endpoint.CHAT, **chat)) is chat_mode


def test_unseeded_sampling_is_continued_only_when_inexact_migration_is_allowed():
    assert resume_mode(request(temperature=0.7)) is None
    assert resume_mode(request(temperature=0.7), inexact=True) is ResumeMode.RESAMPLE
    assert resume_mode(request(temperature=0.7, n=2), inexact=True) is None
    assert resume_mode(request(temperature=0.7, stop=["x"]), inexact=True) is None
    assert (
        resume_mode(request(temperature=0.7, structured_outputs={"regex": "a"}), inexact=True)
        is None
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert resume_mode(request(endpoint=Endpoint.CHAT, temperature=0.7, tools=tools),
                       inexact=True) is None  # fmt: skip


def test_the_client_sees_vllms_bytes_without_the_token_ids_the_router_asked_for():
    transcript = transcript_of(request(temperature=0), ResumeMode.CONTINUE)
    sent = transcript.edit(event("Hel", [5, 6], prompt_ids=[1, 2]) + b"data: [DONE]\n\n")
    assert sent == event("Hel", None, prompt_ids=None) + b"data: [DONE]\n\n"  # type: ignore[arg-type]


def test_a_greedy_stream_continues_from_its_tokens_and_regenerates_the_last_event():
    transcript = transcript_of(request(temperature=0), ResumeMode.CONTINUE)
    transcript.edit(event("Hel", [5, 6], prompt_ids=[1, 2]) + event("lo", [7]))
    continuation = transcript.continuation()
    assert continuation is not None
    assert continuation.body["prompt"] == [1, 2, 5, 6]
    assert continuation.body["max_tokens"] == 8
    assert continuation.skip_text == "lo" and continuation.tokens_before == 2
    assert transcript.continuation() is None, "one continuation per stream"
    # The continuation's events: the text already sent is dropped, the id is the first's.
    again = event("lo", [7], prompt_ids=[1, 2, 5, 6], id="cmpl-second")
    assert transcript.edit(again) == b""
    more = transcript.edit(event("!", [9], id="cmpl-second"))
    assert json.loads(more[6:])["id"] == "cmpl-first"
    assert json.loads(more[6:])["choices"][0]["text"] == "!"
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    chunk = {"id": "cmpl-second", "choices": [], "usage": usage}
    counted = transcript.edit(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    assert json.loads(counted[6:])["usage"] == {"prompt_tokens": 2, "completion_tokens": 4,
                                                "total_tokens": 6}  # fmt: skip


def test_a_seeded_stream_is_replayed_and_a_different_text_is_refused():
    transcript = transcript_of(request(temperature=0.7, seed=3), ResumeMode.REPLAY)
    transcript.edit(event("Hel", [5, 6], prompt_ids=[1, 2]) + event("lo", [7]))
    continuation = transcript.continuation()
    assert continuation.body["prompt"] == [1, 2] and continuation.skip_text == "Hello"
    with pytest.raises(ContinuationDiverged):
        transcript.edit(event("Help", [5, 6, 8]))


def test_without_token_ids_from_the_engine_there_is_nothing_to_continue_from():
    transcript = transcript_of(request(temperature=0), ResumeMode.CONTINUE)
    transcript.edit(event("Hel", None))  # type: ignore[arg-type]
    assert transcript.continuation() is None


def test_past_its_record_bound_a_stream_can_no_longer_migrate():
    transcript = transcript_of(request(temperature=0), ResumeMode.CONTINUE, max_bytes=1024)
    transcript.edit(event("Hel", [5, 6], prompt_ids=[1, 2]))
    transcript.edit(b"".join(event("x" * 100, [7]) for _ in range(10)))
    assert transcript.continuation() is None


def test_escaped_text_and_spaced_json_are_read_back_as_sent():
    transcript = transcript_of(request(temperature=0), ResumeMode.CONTINUE)
    spaced = json.dumps(
        {
            "id": "cmpl-1",
            "choices": [
                {"index": 0, "text": 'a "q"\n\u00e9', "prompt_token_ids": [1], "token_ids": [2]}
            ],
        }
    )
    transcript.edit(b"data: " + spaced.encode() + b"\n\n" + event("end", [3]))
    continuation = transcript.continuation()
    assert continuation.body["prompt"] == [1, 2] and continuation.skip_text == "end"


def test_an_engines_abort_is_cut_from_the_stream_and_its_done_does_not_complete_it():
    """vLLM shutting down ends each running request with finish_reason "abort", usage and
    [DONE]: relayed, that would be a truncated 200 that looks whole."""
    relay = SSERelay(StreamStats(started_s=0.0), on_gap=lambda _: None)
    aborted = b'data: {"id":"c","choices":[{"index":0,"text":"","finish_reason":"abort"}]}\n\n'
    sent = relay.feed(event("Hel", [5]) + aborted)
    assert sent == event("Hel", [5]) and relay.aborted
    assert relay.feed(b"data: [DONE]\n\n") == b"" and not relay.stats.completed
    relay.switched_engine()  # the stream goes on elsewhere
    last = event("lo", [7]).replace(b'"finish_reason":null', b'"finish_reason":"length"')
    assert relay.feed(last + b"data: [DONE]\n\n") and relay.stats.completed


def test_a_stream_that_ends_with_no_choice_finished_is_not_whole():
    """Seen in CI from a SIGTERMed vLLM: cut text, then usage and [DONE], no finish_reason."""
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    relay = SSERelay(StreamStats(started_s=0.0), on_gap=lambda _: None)
    assert relay.feed(event("Hel", [5]) + usage + b"data: [DONE]\n\n") == event("Hel", [5])
    assert relay.aborted and not relay.stats.completed
    whole = SSERelay(StreamStats(started_s=0.0), on_gap=lambda _: None)
    last = event("lo", [7]).replace(b'"finish_reason":null', b'"finish_reason":"length"')
    assert whole.feed(event("Hel", [5]) + last + usage + b"data: [DONE]\n\n")
    assert whole.stats.completed and not whole.aborted


def test_an_error_vllm_sends_in_band_is_not_relayed_as_part_of_the_answer():
    """vLLM's stream generator answers an engine that died under it with data: {"error":
    ...} and [DONE] (completion/serving.py): the client must not get that as output."""
    relay = SSERelay(StreamStats(started_s=0.0), on_gap=lambda _: None)
    error = b'data: {"error": {"message": "EngineDeadError", "type": "x", "code": 500}}\n\n'
    assert relay.feed(event("Hel", [5]) + error + b"data: [DONE]\n\n") == event("Hel", [5])
    assert relay.aborted and not relay.stats.completed


def chat_event(content: str | None, ids: list[int] | None, **top) -> bytes:
    """A vLLM chat chunk: the first names the role and, at the top, the prompt's ids."""
    delta = {"role": "assistant", "content": ""} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    if content is not None:
        choice["token_ids"] = ids
    chunk = {"id": "chatcmpl-first", "object": "chat.completion.chunk", "created": 7,
             "model": "m", "choices": [choice], **top}  # fmt: skip
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def test_a_greedy_chat_continues_as_a_completion_of_its_templated_prompt_in_chat_chunks():
    chat = request(endpoint=Endpoint.CHAT, temperature=0, max_completion_tokens=10,
                   messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    chat.body.pop("prompt")
    transcript = transcript_of(chat, ResumeMode.CONTINUE)
    role = chat_event(None, None, prompt_token_ids=[1, 2], prompt_text=None)
    sent = transcript.edit(role + chat_event("Hel", [5, 6]) + chat_event("lo", [7]))
    assert b"[1,2]" not in sent and b"[5,6]" not in sent, "the client did not ask for ids"
    continuation = transcript.continuation()
    assert continuation.path == "/v1/completions"
    assert continuation.body["prompt"] == [1, 2, 5, 6] and continuation.body["max_tokens"] == 8
    assert "messages" not in continuation.body and "max_completion_tokens" not in continuation.body
    assert transcript.edit(event("lo", [7], prompt_ids=[1, 2, 5, 6], id="cmpl-x")) == b""
    last = event("!", [9], id="cmpl-x").replace(b'"finish_reason":null', b'"finish_reason":"stop"')
    chunk = json.loads(transcript.edit(last)[6:])
    assert chunk["id"] == "chatcmpl-first" and chunk["created"] == 7
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"] == [{"index": 0, "delta": {"content": "!"}, "logprobs": None,
                                 "finish_reason": "stop", "stop_reason": None,
                                 "token_ids": None}]  # fmt: skip
    assert chunk["pdserve_migration"] == {"exact": True, "tokens_before": 3}


def test_a_greedy_chat_whose_delta_is_not_text_is_replayed_as_the_chat():
    """Its tool calls and reasoning are parsed by vLLM's chat serving: no completion of
    token ids gives them back (``test_chat_replay.py`` checks the replay's edits)."""
    chat = request(endpoint=Endpoint.CHAT, temperature=0, messages=[{"role": "user"}])
    chat.body.pop("prompt")
    transcript = transcript_of(chat, ResumeMode.CONTINUE)
    role = chat_event(None, None, prompt_token_ids=[1, 2])
    call = chat_event("", [5]).replace(b'"content":""', b'"tool_calls":[{"index":0}]')
    transcript.edit(role + call)
    continuation = transcript.continuation()
    assert continuation.path == "/v1/chat/completions" and continuation.skip_text == ""
    assert continuation.body["messages"] == [{"role": "user"}]
    assert continuation.output_tokens == 10 and continuation.tokens_before == 0


def test_an_inexact_continuation_samples_on_after_the_last_text_and_says_so():
    transcript = transcript_of(request(temperature=0.7), ResumeMode.RESAMPLE)
    # The last event has no text yet: its token may be half a character.
    transcript.edit(event("Hel", [5, 6], prompt_ids=[1, 2]) + event("lo", [7]) + event("", [8]))
    continuation = transcript.continuation()
    assert continuation.body["prompt"] == [1, 2, 5, 6, 7] and continuation.skip_text == ""
    chunk = json.loads(transcript.edit(event("p!", [8, 9], id="cmpl-x"))[6:])
    assert chunk["choices"][0]["text"] == "p!" and chunk["id"] == "cmpl-first"
    assert chunk["pdserve_migration"] == {"exact": False, "tokens_before": 4}
