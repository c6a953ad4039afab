"""The batch tier's parts alone: input validation, the file store, the batch book's
compare-and-set and lease (on the in-memory state; the Redis one passes the same
state suite, tests/state)."""

from __future__ import annotations

import json

import pytest

from contracts.batch import Batch, FileObject
from router.batch.book import BatchBook, BatchProgress, PendingLines, TooManyBatches
from router.batch.file_store import FileTooLarge, LocalDirectoryStore, read_all
from router.batch.runner import at_risk
from router.batch.validation import check_input
from router.errors import NotFound
from router.observability.metrics import RouterMetrics
from router.state.memory import MemoryState


def body_check(body: dict) -> None:
    if body.get("model") != "m":
        raise NotFound("unknown model", param="model", code="model_not_found")


def line(custom_id: str, **changes: object) -> bytes:
    value = {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
             "body": {"model": "m", "prompt": "hi"}, **changes}  # fmt: skip
    return json.dumps(value).encode()


def test_every_faulty_line_is_named_and_good_lines_are_kept_in_order():
    data = b"\n".join([line("a"), b"", line("b"), b"[1]", line("a"), line("c", method="GET"),
                       line("d", body={"model": "other"})])  # fmt: skip
    checked = check_input(data, endpoint="/v1/completions", check_body=body_check,
                          max_lines=10, max_body_bytes=1000)  # fmt: skip
    assert [x.custom_id for x in checked.lines] == ["a", "b"]
    assert [(e.line, e.code, e.param) for e in checked.errors] == [
        (4, "invalid_request", None), (5, "duplicate_custom_id", "custom_id"),
        (6, "invalid_request", "method"), (7, "model_not_found", "body.model"),
    ]  # fmt: skip


TWO_LINES = b"\n".join([line("a"), line("b")])


@pytest.mark.parametrize(
    ("data", "code"), [(b"\n \n", "empty_file"), (TWO_LINES, "too_many_requests")]
)
def test_a_file_empty_or_too_long_is_one_error(data, code):
    checked = check_input(data, endpoint="/v1/completions", check_body=body_check, max_lines=1,
                          max_body_bytes=1000)  # fmt: skip
    assert [e.code for e in checked.errors] == [code] and checked.lines == []


def test_errors_are_capped_with_a_count_of_the_rest():
    data = b"\n".join([b"{"] * 30)
    checked = check_input(data, endpoint="/v1/completions", check_body=None, max_lines=100,
                          max_body_bytes=1000, max_errors=5)  # fmt: skip
    assert len(checked.errors) == 6 and checked.errors[-1].message == "and 25 more faulty lines"


async def chunks(*parts: bytes):
    for part in parts:
        yield part


async def test_a_file_too_large_leaves_nothing_behind(tmp_path):
    store = LocalDirectoryStore(tmp_path, max_files=10, max_file_bytes=10)
    meta = FileObject(id="file-abc", bytes=0, created_at=1, filename="x.jsonl", purpose="batch")
    with pytest.raises(FileTooLarge):
        await store.put(meta, chunks(b"12345", b"678901"))
    assert await store.get("file-abc") is None and list(tmp_path.iterdir()) == []
    kept = await store.put(meta, chunks(b"12345", b"6789"))
    assert kept.bytes == 9 and await read_all(store, "file-abc") == b"123456789"
    assert [f.id for f in await store.files()] == ["file-abc"]
    assert await store.delete("file-abc") and await store.get("file-abc") is None
    assert await store.get("../../etc/passwd") is None  # never a path outside the root


def batch(batch_id: str, status: str = "validating") -> Batch:
    return Batch(id=batch_id, endpoint="/v1/completions", input_file_id="file-1",
                 completion_window="24h", created_at=1, status=status)  # fmt: skip


async def test_a_lease_is_one_runners_until_it_lapses():
    now = [100.0]
    book = BatchBook(MemoryState(), max_batches=10, wall_clock=lambda: now[0])
    await book.create(batch("batch_1"))
    assert await book.take_lease("batch_1", "r1", 10)
    assert not await book.take_lease("batch_1", "r2", 10)
    assert await book.take_lease("batch_1", "r1", 10)  # renewed
    now[0] += 11
    assert await book.take_lease("batch_1", "r2", 10)  # r1 went quiet: r2 takes it over
    assert (await book.get("batch_1")).owner == "r2"


async def test_the_book_keeps_max_batches_pushing_out_the_oldest_ended():
    state = MemoryState()
    book = BatchBook(state, max_batches=2, wall_clock=lambda: 0.0)
    await book.create(batch("batch_1", status="completed"))
    await state.record_batch_line("batch_1", "a", "{}")
    await book.create(batch("batch_2"))
    await book.create(batch("batch_3"))
    assert await book.ids() == ["batch_2", "batch_3"]
    assert await book.get("batch_1") is None and await state.batch_lines("batch_1") == {}
    with pytest.raises(TooManyBatches):  # none ended: refused, and nothing of it kept
        await book.create(batch("batch_4"))
    assert await book.ids() == ["batch_2", "batch_3"] and await book.get("batch_4") is None


@pytest.mark.parametrize(
    ("now_s", "done", "left", "expected"),
    [
        (103, 10, 90, False),  # too early to judge
        (110, 10, 90, True),  # 1 line/s, 90 left, 50 s to go
        (110, 100, 90, False),  # 10 lines/s: done in 9 s
        (110, 0, 90, False),  # none done yet: 10 s gone, 50 s left
        (130, 0, 90, True),  # none done in 30 s, with 30 s left
        (110, 10, 0, False),  # nothing left
    ],
)  # fmt: skip
def test_a_batch_is_at_risk_when_its_pace_ends_past_its_window(now_s, done, left, expected):
    assert at_risk(now_s=now_s, started_s=100, done=done, left=left, expires_at=160) is expected


def test_pending_lines_by_model_add_up_over_batches_and_go_with_them():
    metrics = RouterMetrics(window_s=60, recent_ttft_samples=10, clock=lambda: 0.0)

    def progress(lines: int, seconds_left: float | None) -> BatchProgress:
        part = PendingLines(lines=lines, prompt_tokens=100 * lines, output_tokens=10 * lines)
        return BatchProgress(pending={"m": part}, seconds_left=seconds_left)

    def shown() -> dict[str, float]:
        text = metrics.exposition().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith("pdserve_batch_")}  # fmt: skip

    metrics.batch_progress("b1", progress(100, 50.0))
    metrics.batch_progress("b2", progress(20, 10.0))
    metrics.batch_progress("b3", progress(30, None))  # no deadline: pending, never due
    seen = shown()
    assert seen['pdserve_batch_pending_lines{model="m"}'] == 150
    assert seen['pdserve_batch_pending_tokens{direction="input",model="m"}'] == 15_000
    assert seen['pdserve_batch_due_lines_per_second{model="m"}'] == pytest.approx(100 / 50 + 2)
    for batch_id in ("b1", "b2", "b3"):
        metrics.batch_progress(batch_id, None)
    assert not any(name.startswith("pdserve_batch_pending") for name in shown())
