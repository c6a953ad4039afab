"""The official ``openai`` client against the router, disaggregated end to end."""

from __future__ import annotations

import openai
import pytest

from tests.clusters import COLOCATED_MODEL, MODEL


@pytest.fixture
def client(router_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router_url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_every_served_model(client):
    assert {m.id for m in client.models.list()} == {MODEL, COLOCATED_MODEL}


def test_streamed_chat_arrives_in_pieces_and_reports_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completion_honours_max_tokens_and_stop(client):
    completion = client.completions.create(
        model=MODEL, prompt="def main():", max_tokens=8, temperature=0, seed=7
    )
    assert completion.model == MODEL
    assert completion.usage.completion_tokens <= 8
    assert completion.choices[0].text
    text = completion.choices[0].text
    stop = text.strip()[:2]
    stopped = client.completions.create(
        model=MODEL, prompt="def main():", max_tokens=8, temperature=0, stop=[stop]
    )
    assert stop not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"


def test_unknown_model_is_a_not_found_error(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.body["code"] == "model_not_found"
