"""/openapi.json documents the request bodies the router reads, with no dangling refs."""

from __future__ import annotations

from router.http.app import create_app
from router.settings import RouterSettings


def body_schema(spec: dict, path: str, method: str) -> dict:
    return spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def test_public_and_admin_bodies_are_documented():
    spec = create_app(RouterSettings()).openapi()
    chat = body_schema(spec, "/v1/chat/completions", "post")
    assert {"model", "messages", "stream", "max_completion_tokens"} <= set(chat["properties"])
    assert "ChatMessage" in spec["components"]["schemas"]
    assert set(body_schema(spec, "/admin/v1/pools/{model}", "put")["properties"]) == {
        "prefill", "decode", "ratio",
    }  # fmt: skip
    assert "engine_url" in body_schema(spec, "/admin/workers/register", "post")["properties"]


def test_every_ref_resolves():
    spec = create_app(RouterSettings()).openapi()
    refs = _refs(spec)
    assert "#/components/schemas/ChatMessage" in refs
    for ref in refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in spec["components"]["schemas"], ref


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if "$ref" in node else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_public_answers_stream_chunks_and_errors_are_documented():
    spec = create_app(RouterSettings()).openapi()
    schemas = spec["components"]["schemas"]
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert chat["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionResponse"
    )
    assert (
        "ChatCompletionChunk"
        in chat["200"]["content"]["text/event-stream"]["schema"]["description"]
    )
    assert {"ChatCompletionChunk", "CompletionChunk", "Usage"} <= set(schemas)
    for status in ("400", "401", "404", "413", "429", "502", "503"):
        assert chat[status]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorResponse"
        ), status
    assert "Retry-After" in chat["429"]["headers"] and "Retry-After" in chat["503"]["headers"]
    assert set(schemas["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}
    completions = spec["paths"]["/v1/completions"]["post"]["responses"]
    assert completions["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/CompletionResponse"
    )
    models = spec["paths"]["/v1/models"]["get"]["responses"]["200"]
    assert models["content"]["application/json"]["schema"]["$ref"].endswith("/ModelList")
    pools = spec["paths"]["/admin/v1/pools/{model}"]["put"]["responses"]
    assert {"400", "401", "403"} <= set(pools)
    assert "422" not in pools and "422" not in chat  # FastAPI's own shape is never answered
