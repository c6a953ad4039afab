"""A chat replayed from the start on another worker: what its client gets of the replay."""

from __future__ import annotations

import json

import pytest

from router.errors import ContinuationDiverged
from router.orchestration.migration import ResumeMode, Transcript, resume_mode
from router.prepare.prepare import Endpoint, PreparedRequest

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def chat(**body) -> PreparedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "temperature": 0, "max_tokens": 50, **body}  # fmt: skip
    return PreparedRequest(endpoint=Endpoint.CHAT, body=body, model="m", stream=True,
                           arrived_s=0.0, requested_model="m", max_output_tokens=50)  # fmt: skip


def event(delta: dict, ids: list[int] | None = None, *, id: str = "chatcmpl-first",
          finish: str | None = None, **top) -> bytes:  # fmt: skip
    """A vLLM chat chunk (compact, as vLLM writes it)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
              "token_ids": ids}  # fmt: skip
    chunk = {"id": id, "object": "chat.completion.chunk", "created": 7 if id == "chatcmpl-first"
             else 99, "model": "m", "choices": [choice], **top}  # fmt: skip
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


ROLE = {"role": "assistant", "content": ""}


def opening(call_id: str, name: str = "get_weather") -> dict:
    return {"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                            "function": {"name": name, "arguments": ""}}]}  # fmt: skip


def arguments(text: str) -> dict:
    return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


def received_and_replayed(prepared: PreparedRequest, received: bytes) -> Transcript:
    mode = resume_mode(prepared)
    assert mode is not None
    transcript = Transcript(prepared, mode, client_wants_ids=False, max_bytes=1 << 20)
    transcript.edit(received)
    continuation = transcript.continuation()
    assert continuation is not None and continuation.path == "/v1/chat/completions"
    return transcript


def deltas(sent: bytes) -> list[dict]:
    chunks = [json.loads(e[6:]) for e in sent.split(b"\n\n") if e.startswith(b"data: {")]
    return [c["choices"][0]["delta"] for c in chunks if c["choices"]]


def test_a_tool_call_goes_on_under_the_id_the_client_got_with_the_arguments_it_lacks():
    prepared = chat(tools=TOOLS, tool_choice="auto")
    assert resume_mode(prepared) is ResumeMode.REPLAY
    first = [event(ROLE, prompt_token_ids=[1, 2]), event(opening("call-A"), [5, 6]),
             event(arguments('{"city": "Pa'), [7, 8])]  # fmt: skip
    transcript = received_and_replayed(prepared, b"".join(first))
    replay = [event(ROLE, id="chatcmpl-b", prompt_token_ids=[1, 2]),
              event(opening("call-B"), [5, 6], id="chatcmpl-b"),
              event(arguments('{"city": '), [7], id="chatcmpl-b"),
              event(arguments('"Paris"}'), [8, 9], id="chatcmpl-b")]  # fmt: skip
    sent = transcript.edit(b"".join(replay))
    assert deltas(sent) == [arguments('ris"}')]
    chunk = json.loads(sent.split(b"\n\n")[0][6:])
    assert chunk["id"] == "chatcmpl-first" and chunk["created"] == 7
    assert chunk["pdserve_migration"] == {"exact": True, "tokens_before": 4}
    assert chunk["choices"][0]["token_ids"] is None, "the client did not ask for ids"


def test_a_second_tool_call_the_client_never_saw_opens_with_the_replays_id():
    prepared = chat(tools=TOOLS)
    transcript = received_and_replayed(
        prepared, event(ROLE, prompt_token_ids=[1]) + event(opening("call-A"), [5])
    )
    second = {"tool_calls": [{"index": 1, "id": "call-C", "type": "function",
                              "function": {"name": "get_weather"}}]}  # fmt: skip
    sent = transcript.edit(event(ROLE, id="x") + event(opening("call-B"), [5], id="x")
                           + event(second, [6], id="x"))  # fmt: skip
    assert deltas(sent) == [second]


def test_reasoning_then_content_go_on_channel_by_channel():
    """A greedy chat is continued from its token ids while all it got was text; a
    reasoning parser's delta makes it a replay."""
    prepared = chat()
    assert resume_mode(prepared) is ResumeMode.CONTINUE
    first = [event(ROLE, prompt_token_ids=[1]), event({"reasoning": "Let me "}, [5]),
             event({"reasoning": "think."}, [6]), event({"content": "It is"}, [7])]  # fmt: skip
    transcript = received_and_replayed(prepared, b"".join(first))
    replay = [event(ROLE, id="x"), event({"reasoning": "Let me think."}, [5, 6], id="x"),
              event({"content": "It is 4."}, [7, 8], id="x"),
              event({}, [], id="x", finish="stop")]  # fmt: skip
    sent = transcript.edit(b"".join(replay))
    assert deltas(sent) == [{"content": " 4."}, {}]
    assert json.loads(sent.split(b"\n\n")[1][6:])["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "replay",
    [
        [event({"reasoning": "Let me thunk"}, [5])],  # the received text, differently
        [event({"content": "It"}, [5])],  # new text while reasoning is still owed
        [event({"reasoning": "Let me "}, [5]), event(opening("call-B"), [6])],
    ],
    ids=["different text", "out of order", "a call where reasoning was"],
)
def test_a_replay_that_differs_from_what_the_client_got_is_refused(replay):
    first = event(ROLE, prompt_token_ids=[1]) + event({"reasoning": "Let me think"}, [5, 6])
    transcript = received_and_replayed(chat(seed=3, temperature=0.7), first)
    with pytest.raises(ContinuationDiverged):
        transcript.edit(event(ROLE, id="x") + b"".join(replay))


def test_the_usage_counts_the_whole_answer_the_replay_generated():
    transcript = received_and_replayed(
        chat(seed=3, temperature=0.7),
        event(ROLE, prompt_token_ids=[1]) + event({"content": "a"}, [5]),
    )
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    usage_chunk = {"id": "x", "object": "chat.completion.chunk", "created": 99, "model": "m",
                   "choices": [], "usage": usage}  # fmt: skip
    sent = transcript.edit(b"data: " + json.dumps(usage_chunk).encode() + b"\n\ndata: [DONE]\n\n")
    chunk = json.loads(sent.split(b"\n\n")[0][6:])
    assert chunk["usage"] == usage and chunk["id"] == "chatcmpl-first"
    assert sent.endswith(b"data: [DONE]\n\n")


def test_past_its_record_bound_a_chat_cannot_be_replayed():
    prepared = chat(tools=TOOLS)
    transcript = Transcript(prepared, ResumeMode.REPLAY, client_wants_ids=False, max_bytes=256)
    transcript.edit(event(ROLE, prompt_token_ids=[1]) + event(arguments("x" * 300), [5]))
    assert transcript.continuation() is None
