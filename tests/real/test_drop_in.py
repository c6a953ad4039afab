"""Differential: what a plain vLLM accepts, the router accepts and answers the same way.

Each request shape of the corpus (``loadgen.drop_in_corpus``) goes to the
colocated vLLM directly and to the router's P/D path for the same weights. The status
codes must match; for 200s, every choice's text (by index), its finish reason and the
usage must match (greedy, so both sides generate the same tokens). Deliberate
differences are listed in DIFFERENT with their reasons.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
import pytest

from loadgen.drop_in_corpus import cases, request
from tests.clusters import COLOCATED_MODEL, MODEL
from tests.generation import choice_text

# Shapes where pdserve answers differently on purpose, with the reason.
DIFFERENT: dict[str, str] = {}

CASES = [pytest.param(path, shape, id=f"{kind}: {name}") for kind, path, name, shape in cases()]


@dataclass
class Answer:
    status: int
    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    usage: dict | None = None
    error: dict | None = None
    done: bool = False


def ask(base_url: str, path: str, body: dict) -> Answer:
    """POST ``body`` and fold the answer (streamed or not) into texts by choice index."""
    with httpx.Client(timeout=180) as client:
        if not body.get("stream"):
            response = client.post(base_url + path, json=body)
            answer = Answer(response.status_code)
            payload = response.json()
            if response.status_code != 200:
                answer.error = payload.get("error")
                return answer
            for choice in payload["choices"]:
                answer.texts[choice["index"]] = choice_text(choice)
                answer.finish[choice["index"]] = choice.get("finish_reason")
            answer.usage = payload.get("usage")
            return answer
        with client.stream("POST", base_url + path, json=body) as response:
            answer = Answer(response.status_code)
            if response.status_code != 200:
                answer.error = json.loads(response.read()).get("error")
                return answer
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line.partition(":")[2].strip()
                if data == "[DONE]":
                    answer.done = True
                    continue
                chunk = json.loads(data)
                for choice in chunk.get("choices") or []:
                    index = choice["index"]
                    answer.texts[index] = answer.texts.get(index, "") + choice_text(choice)
                    if choice.get("finish_reason"):
                        answer.finish[index] = choice["finish_reason"]
                if chunk.get("usage"):
                    answer.usage = chunk["usage"]
            return answer


@pytest.mark.parametrize(("path", "shape"), CASES)
def test_router_answers_every_shape_as_vllm_does(router_url, colocated_engine_url, path, shape):
    reference = ask(colocated_engine_url, path, request(shape, COLOCATED_MODEL))
    routed = ask(router_url, path, request(shape, MODEL))
    assert routed.status == reference.status, (routed.error, reference.error)
    if reference.status != 200:
        assert routed.error and {"message", "type"} <= routed.error.keys()
        return
    assert routed.texts == reference.texts
    assert routed.finish == reference.finish
    assert routed.usage == reference.usage
    assert routed.done == reference.done
