"""A batch's input file, checked whole before any line runs.

Every line is checked, and every fault is reported with its 1-based line number (at
most ``max_errors`` of them, then one more error counting the rest): a JSON object
with ``custom_id`` (unique in the file), ``method`` POST, ``url`` the batch's endpoint
and a ``body`` the endpoint would take. The body is checked by ``check_body``, the same
validation a client's request gets (schema, model, the tenant's allowed models), so a
batch never half-runs into lines the endpoint refuses (``None``: the file was checked
before, only its lines are wanted). A streamed body is refused: a
batch line's answer is one JSON body. Blank lines are skipped, as OpenAI does.

Codes: ``empty_file``, ``too_many_requests``, ``invalid_json_line``,
``missing_required_parameter``, ``invalid_request``, ``invalid_url``,
``duplicate_custom_id``, ``request_too_large``, ``streaming_unsupported``, and a
checked body's own (``model_not_found``, ``invalid_value``, ...), with ``param`` as
``body.<field>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from contracts.batch import BatchError, InputLine
from router.errors import APIError

BodyCheck = Callable[[dict], None]  # raises APIError as the endpoint would


@dataclass(frozen=True, slots=True)
class CheckedInput:
    lines: list[InputLine]
    errors: list[BatchError]


def check_input(
    data: bytes,
    *,
    endpoint: str,
    check_body: BodyCheck | None,
    max_lines: int,
    max_body_bytes: int,
    max_errors: int = 100,
) -> CheckedInput:
    lines: list[InputLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    numbered = [(n, raw) for n, raw in enumerate(data.split(b"\n"), 1) if raw.strip()]
    if not numbered:
        return CheckedInput([], [BatchError(code="empty_file", message="the file has no lines")])
    if len(numbered) > max_lines:
        message = f"{len(numbered)} requests; a batch takes at most {max_lines}"
        return CheckedInput([], [BatchError(code="too_many_requests", message=message)])
    for number, raw in numbered:
        line, fault = _check_line(raw, number, endpoint, check_body, max_body_bytes)
        if fault is None and line is not None and line.custom_id in seen:
            fault = BatchError(
                code="duplicate_custom_id",
                param="custom_id",
                line=number,
                message=f"custom_id {line.custom_id!r} is used by an earlier line",
            )
        if fault is not None:
            errors.append(fault)
        elif line is not None:
            seen.add(line.custom_id)
            lines.append(line)
    if len(errors) > max_errors:
        more = len(errors) - max_errors
        errors = [
            *errors[:max_errors],
            BatchError(code="too_many_errors", message=f"and {more} more faulty lines"),
        ]
    return CheckedInput(lines, errors)


def _check_line(
    raw: bytes, number: int, endpoint: str, check_body: BodyCheck | None, max_body_bytes: int
) -> tuple[InputLine | None, BatchError | None]:
    def fault(code: str, message: str, param: str | None = None) -> BatchError:
        return BatchError(code=code, message=message, param=param, line=number)

    try:
        value = json.loads(raw)
    except ValueError:
        return None, fault("invalid_json_line", "This line is not parseable as valid JSON.")
    if not isinstance(value, dict):
        return None, fault("invalid_request", "a line must be a JSON object")
    for field in ("custom_id", "method", "url", "body"):
        if field not in value:
            return None, fault("missing_required_parameter", f"{field} is required", field)
    try:
        line = InputLine.model_validate(value)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        return None, fault("invalid_request", f"{param}: {first['msg']}", param)
    if line.url != endpoint:
        return None, fault(
            "invalid_url", f"url {line.url!r} does not match the batch's endpoint {endpoint}", "url"
        )
    if len(raw) > max_body_bytes:
        return None, fault(
            "request_too_large", f"the request is over {max_body_bytes} bytes", "body"
        )
    if line.body.get("stream"):
        return None, fault("streaming_unsupported", "a batch line cannot stream", "body.stream")
    try:
        if check_body is not None:
            check_body(line.body)
    except APIError as error:
        param = f"body.{error.param}" if error.param else "body"
        return None, fault(error.code or "invalid_request", error.message, param)
    return line, None
