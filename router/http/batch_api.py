"""``/v1/files`` and ``/v1/batches``, as OpenAI's SDK calls them.

A tenant sees only its own files and batches: another tenant's id is a 404, as an
unknown one is. Uploads are ``multipart/form-data`` (``file``, ``purpose=batch``, a
``.jsonl`` name) with a declared length; past ``max_file_bytes`` they are a 413 and
nothing is kept. A batch is created ``validating``; the runner (``router/batch``) checks
its file and runs it. Lists page by id (``after``), newest first for batches.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from contracts.batch import ENDED, ENDPOINTS, Batch, FileObject
from router.batch.book import BatchRecord, TooManyBatches, new_batch_id
from router.batch.file_store import FileTooLarge, StoreFull, new_file_id
from router.batch.tier import BatchTier
from router.errors import Conflict, InvalidRequest, NotFound, Overloaded, RequestTooLarge
from router.http.access import Access, Route, parts_of
from router.http.admin_api import audit_change
from router.http.http_io import json_body, validated

_FORM_OVERHEAD_BYTES = 64 * 1024  # multipart boundaries and the other fields
_WINDOW = re.compile(r"^(\d{1,4})([smh])$")
_MAX_WINDOW_S = 7 * 24 * 3600


class BatchCreate(BaseModel):
    input_file_id: str = Field(min_length=1, max_length=100)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


def _tier(request: Request) -> BatchTier:
    return parts_of(request).batch


def _tenant(request: Request) -> str:
    tenant = getattr(request.state, "tenant", None)
    return tenant.name if tenant is not None else ""


def _page(items: Sequence[FileObject | Batch], after: str | None, limit: int) -> dict[str, Any]:
    ids = [item.id for item in items]
    start = ids.index(after) + 1 if after in ids else 0
    page = list(items[start : start + limit])
    return {
        "object": "list",
        "data": [item.public() for item in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": start + limit < len(items),
    }


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"limit must be between 1 and {most}", param="limit")
    return int(raw)


# -- files --------------------------------------------------------------------------


async def upload_file(request: Request) -> dict[str, Any]:
    tier = _tier(request)
    declared = request.headers.get("content-length", "")
    if not declared.isdigit():
        raise InvalidRequest("an upload needs a Content-Length", code="length_required")
    if int(declared) > tier.settings.max_file_bytes + _FORM_OVERHEAD_BYTES:
        raise RequestTooLarge(
            f"the file is over {tier.settings.max_file_bytes} bytes",
            param="file",
            code="file_too_large",
        )
    async with request.form(max_files=1, max_fields=8) as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            raise InvalidRequest("purpose must be 'batch'", param="purpose")
        if upload is None or isinstance(upload, str):  # a form value is text or a file
            raise InvalidRequest("the form needs a file part named 'file'", param="file")
        name = getattr(upload, "filename", None) or ""
        if not name.endswith(".jsonl"):
            raise InvalidRequest("Invalid file format for Batch API. Must be .jsonl", param="file")
        meta = FileObject(
            id=new_file_id(),
            bytes=0,
            created_at=int(time.time()),
            filename=name[-256:],
            purpose="batch",
            tenant=_tenant(request),
        )
        try:
            kept = await tier.files.put(meta, _chunks(upload))
        except FileTooLarge as error:
            raise RequestTooLarge(str(error), param="file", code="file_too_large") from None
        except StoreFull as error:
            raise InvalidRequest(str(error), code="storage_full") from None
    return kept.public()


async def _chunks(upload: Any) -> AsyncIterator[bytes]:
    """An uploaded part's bytes (Starlette's ``UploadFile``), a MiB at a time."""
    while chunk := await upload.read(1024 * 1024):
        yield chunk


async def _own_file(request: Request, file_id: str) -> FileObject:
    found = await _tier(request).files.get(file_id)
    if found is None or found.tenant != _tenant(request):
        raise NotFound(f"No such File object: {file_id}", param="file_id", code="file_not_found")
    return found


async def list_files(request: Request) -> dict[str, Any]:
    limit = _limit(request, 10_000, 10_000)
    purpose = request.query_params.get("purpose")
    files = [
        f
        for f in await _tier(request).files.files()
        if f.tenant == _tenant(request) and purpose in (None, f.purpose)
    ]
    if request.query_params.get("order", "desc") == "desc":
        files.reverse()
    return _page(files, request.query_params.get("after"), limit)


async def get_file(request: Request) -> dict[str, Any]:
    return (await _own_file(request, request.path_params["file_id"])).public()


async def file_content(request: Request) -> StreamingResponse:
    found = await _own_file(request, request.path_params["file_id"])
    return StreamingResponse(
        _tier(request).files.read(found.id), media_type="application/octet-stream"
    )


async def delete_file(request: Request) -> dict[str, Any]:
    """A file a batch still reads (its input, while it has not ended) is kept: 409."""
    found = await _own_file(request, request.path_params["file_id"])
    async for record in _tier(request).book.records():
        batch = record.batch
        if batch.input_file_id == found.id and batch.status not in ENDED:
            raise Conflict(f"batch {batch.id} is {batch.status} and reads this file; "
                           "cancel it first", param="file_id", code="file_in_use")  # fmt: skip
    deleted = await _tier(request).files.delete(found.id)
    return {"id": found.id, "object": "file", "deleted": deleted}


# -- batches --------------------------------------------------------------------------


def _window_s(window: str) -> int:
    matched = _WINDOW.match(window)
    seconds = 0
    if matched:
        seconds = int(matched[1]) * {"s": 1, "m": 60, "h": 3600}[matched[2]]
    if not 0 < seconds <= _MAX_WINDOW_S:
        raise InvalidRequest(
            "completion_window must be like '24h' (at most 168h)", param="completion_window"
        )
    return seconds


async def create_batch(request: Request) -> dict[str, Any]:
    tier = _tier(request)
    asked = validated(BatchCreate, await json_body(request, 64 * 1024))
    if asked.endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    metadata = asked.metadata or {}
    if len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise InvalidRequest(
            "metadata: at most 16 pairs, keys to 64 and values to 512 characters", param="metadata"
        )
    window_s = _window_s(asked.completion_window)
    source = await _own_file(request, asked.input_file_id)
    if source.purpose != "batch":
        raise InvalidRequest("the input file's purpose must be 'batch'", param="input_file_id")
    now = int(time.time())
    batch = Batch(
        id=new_batch_id(),
        endpoint=asked.endpoint,
        input_file_id=source.id,
        completion_window=asked.completion_window,
        created_at=now,
        expires_at=now + window_s,
        metadata=asked.metadata,
        tenant=_tenant(request),
    )
    try:
        await tier.book.create(batch)
    except TooManyBatches as error:
        raise Overloaded(str(error), code="too_many_batches", retry_after_s=60) from None
    return batch.public()


async def _own_batch(request: Request, batch_id: str) -> BatchRecord:
    found = await _tier(request).book.get(batch_id)
    if found is None or found.batch.tenant != _tenant(request):
        raise NotFound(
            f"No such Batch object: {batch_id}", param="batch_id", code="batch_not_found"
        )
    return found


async def get_batch(request: Request) -> dict[str, Any]:
    return (await _own_batch(request, request.path_params["batch_id"])).batch.public()


async def list_batches(request: Request) -> dict[str, Any]:
    limit = _limit(request, 20, 100)
    tenant = _tenant(request)
    mine = [record.batch async for record in _tier(request).book.records(newest_first=True)
            if record.batch.tenant == tenant]  # fmt: skip
    return _page(mine, request.query_params.get("after"), limit)


async def cancel_batch(request: Request) -> dict[str, Any]:
    batch_id = request.path_params["batch_id"]
    await _own_batch(request, batch_id)
    return (await _cancel(_tier(request), batch_id)).public()


async def _cancel(tier: BatchTier, batch_id: str) -> Batch:
    now = int(time.time())

    def cancel(record: BatchRecord) -> BatchRecord | None:
        if record.batch.status not in ("validating", "in_progress"):
            return None
        batch = record.batch.model_copy(update={"status": "cancelling", "cancelling_at": now})
        return record.model_copy(update={"batch": batch})

    record = await tier.book.change(batch_id, cancel)
    if record is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    status = record.batch.status
    if status in ENDED or status == "finalizing":
        raise Conflict(f"the batch is {status}: it cannot be cancelled", code="batch_ended")
    return record.batch


# -- the SRE's view: every tenant's batches ----------------------------------------------


async def admin_list_batches(request: Request) -> dict[str, Any]:
    """Every batch, newest first, with its tenant (``pdserve admin batches``)."""
    limit = _limit(request, 100, 1000)
    found = []
    async for record in _tier(request).book.records(newest_first=True):
        progress = record.progress and record.progress.model_dump()
        found.append({**record.batch.public(), "tenant": record.batch.tenant,
                      "runner": record.owner, "at_risk": record.at_risk,
                      "progress": progress})  # fmt: skip
        if len(found) >= limit:
            break
    return {"object": "list", "data": found}


async def admin_cancel_batch(request: Request) -> dict[str, Any]:
    batch_id = request.path_params["batch_id"]
    cancelled = await _cancel(_tier(request), batch_id)
    await audit_change(request, "cancel_batch", batch_id)
    return cancelled.public()


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/files", upload_file, Access.CLIENT, answer=FileObject),
    Route("GET", "/v1/files", list_files, Access.CLIENT),
    Route("GET", "/v1/files/{file_id}", get_file, Access.CLIENT, answer=FileObject),
    Route("GET", "/v1/files/{file_id}/content", file_content, Access.CLIENT),
    Route("DELETE", "/v1/files/{file_id}", delete_file, Access.CLIENT),
    Route("POST", "/v1/batches", create_batch, Access.CLIENT, body=BatchCreate, answer=Batch),
    Route("GET", "/v1/batches", list_batches, Access.CLIENT),
    Route("GET", "/v1/batches/{batch_id}", get_batch, Access.CLIENT, answer=Batch),
    Route("POST", "/v1/batches/{batch_id}/cancel", cancel_batch, Access.CLIENT, answer=Batch),
    Route("GET", "/admin/v1/batches", admin_list_batches, Access.VIEWER),
    Route("POST", "/admin/v1/batches/{batch_id}/cancel", admin_cancel_batch, Access.OPERATOR),
)
