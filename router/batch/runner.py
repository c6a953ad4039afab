"""Runs batches: validates each input file, sends its lines through the router's own
request path at the lowest priority, keeps every line's outcome, and writes the output
and error files.

A replica's runner scans the batches every ``batch_poll_s`` and takes those whose
lease is free (``book.py``), at most ``batch_max_active`` at once. For a batch it holds:
- ``validating``: the input file is checked whole (``validation.py``); any fault fails
  the batch with every faulty line named, and nothing runs;
- ``in_progress``: the lines not yet kept are sent as the batch's tenant with priority
  ``batch`` (``LineAnswer``: the same validation, screens, rate limits, admission and
  routing a client's request gets, so the tenant's quotas count batch tokens), and
  yielding: admission takes a line only onto room interactive traffic leaves
  (``batch_yields``, ``batch_prefill_share``). How many
  go at once (``pacing.py``) grows while lines are taken and halves when one is
  refused for want of room (a yield to interactive traffic only delays the line), up
  to ``batch_max_in_flight``. A 429 or 503 (no room now) is not an
  outcome: the line waits and goes again. Another 5xx is tried again up to
  ``failed_attempts`` in all. Any other answer is kept, once
  per ``custom_id`` (``ControlState.record_batch_line``), before the line counts as
  done;
- a batch at risk of missing its window (``at_risk``) is flagged, and its lines stop
  yielding (they still queue behind interactive traffic) with at least half
  ``batch_max_in_flight`` at once;
- a cancel (``cancelling``) or the end of the completion window stops sending; lines
  in flight finish and are kept;
- ``finalizing``: the kept lines go to the output file (2xx) and the error file (the
  rest, and a ``batch_cancelled`` or ``batch_expired`` error for each line never run),
  under ids derived from the batch's, so a replica that takes over a half-finished
  finalization writes the same files again, not new ones.

A runner that dies mid-batch leaves its lease to lapse; the next one skips every kept
line. A line in flight at the crash runs again, and only its first outcome is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from contracts.batch import (
    ENDED,
    Batch,
    BatchError,
    BatchErrors,
    FileObject,
    InputLine,
    LineError,
    LineResponse,
    OutputLine,
    RequestCounts,
)
from router.batch.book import BatchBook, BatchProgress, BatchRecord, PendingLines
from router.batch.file_store import FileStore, read_all
from router.batch.pacing import LinePacer, Send
from router.batch.validation import BodyCheck, check_input
from router.state.base import ControlState

log = logging.getLogger("pdserve.batch")


@dataclass(frozen=True, slots=True)
class LineReply:
    """The router's answer to one line: its status and body, Retry-After on a 429/503,
    and whether admission refused it to make room for interactive traffic."""

    status: int
    body: bytes
    retry_after_s: float | None = None
    yielded: bool = False


# (endpoint path, body, tenant name, yields to interactive traffic) -> the reply
LineAnswer = Callable[[str, dict, str, bool], Awaitable[LineReply]]
BodyChecks = Callable[[str, str], BodyCheck]  # (endpoint, tenant) -> its body check
_RATE_WINDOW_S = 60  # lines per second are over the last this many seconds
# Lines a batch starts with, as TCP starts with several segments, not one: a line's round
# trip includes its decode (seconds), and slow start from one took about 18 s to reach
# pace in the batch benchmark.
_INITIAL_LINES = 4
_NO_ROOM = frozenset({429, 503})  # no room now: wait and send again, as long as it takes


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerLimits:
    poll_s: float = 1.0
    lease_s: float = 15.0
    max_active: int = 4
    max_in_flight: int = 4
    max_lines: int = 50_000
    max_body_bytes: int = 4 * 1024 * 1024
    retry_cap_s: float = 30.0
    failed_attempts: int = 3  # tries of a line whose answer is a 5xx (a worker died)
    yield_wait_s: float = 0.1  # the first wait of a line refused to make room; it doubles


class BatchRunner:
    def __init__(
        self,
        *,
        book: BatchBook,
        state: ControlState,
        files: FileStore,
        answer: LineAnswer,
        body_checks: BodyChecks,
        limits: RunnerLimits,
        meters: BatchMeters | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._book = book
        self._state = state
        self._files = files
        self._answer = answer
        self._body_checks = body_checks
        self._limits = limits
        self._meters = meters or _NoMeters()
        self._now = wall_clock
        self.owner = "runner-" + secrets.token_hex(6)
        self._running: dict[str, asyncio.Task[None]] = {}

    def __repr__(self) -> str:
        return f"BatchRunner({self.owner}, running={sorted(self._running)})"

    async def run_forever(self) -> None:
        try:
            while True:
                try:
                    await self.scan()
                except Exception:  # the state may be away; the next scan tries again
                    log.exception("batch scan failed")
                await asyncio.sleep(self._limits.poll_s)
        finally:
            for task in self._running.values():
                task.cancel()

    async def scan(self) -> None:
        """Take the batches whose lease is free, and count every batch by status."""
        statuses: dict[str, int] = {}
        async for record in self._book.records():
            batch_id, status = record.batch.id, record.batch.status
            statuses[status] = statuses.get(status, 0) + 1
            if (
                status in ENDED or batch_id in self._running
                or len(self._running) >= self._limits.max_active
            ):  # fmt: skip
                continue
            if await self._book.take_lease(batch_id, self.owner, self._limits.lease_s):
                task = asyncio.create_task(self._run(batch_id), name=f"batch {batch_id}")
                self._running[batch_id] = task
                task.add_done_callback(lambda _, b=batch_id: self._running.pop(b, None))
        self._meters.batch_statuses(statuses)

    async def _run(self, batch_id: str) -> None:
        stop = asyncio.Event()
        keeper = asyncio.create_task(self._keep_lease(batch_id, stop))
        try:
            record = await self._book.get(batch_id)
            if record is None:
                return
            lines = await self._lines(record)
            if lines is None:
                return  # failed validation
            record = await self._book.get(batch_id)
            if record is not None and record.batch.status == "in_progress":
                await self._send(record, lines, stop)
            await self._finish(batch_id, lines)
        except Exception:
            log.exception("batch %s: run failed; it is taken up again", batch_id)
        finally:
            keeper.cancel()

    async def _keep_lease(self, batch_id: str, stop: asyncio.Event) -> None:
        """Renew the lease and watch for a cancel or the window's end, every third of a
        lease; a lost lease stops this runner's work on the batch."""
        current = asyncio.current_task()
        while True:
            await asyncio.sleep(min(self._limits.lease_s / 3, 1.0))
            if not await self._book.take_lease(batch_id, self.owner, self._limits.lease_s):
                log.warning("batch %s: lease lost to another runner", batch_id)
                run = self._running.get(batch_id)
                if run is not None and run is not current:
                    run.cancel()
                return
            record = await self._book.get(batch_id)
            if record is None or record.batch.status == "cancelling" or self._expired(record):
                stop.set()

    def _expired(self, record: BatchRecord) -> bool:
        expires = record.batch.expires_at
        return expires is not None and self._now() >= expires

    async def _lines(self, record: BatchRecord) -> list[InputLine] | None:
        """The batch's lines; validated first if the batch is new (None: it failed)."""
        batch = record.batch
        now = int(self._now())
        validating = batch.status == "validating"
        try:
            data = await read_all(self._files, batch.input_file_id)
        except FileNotFoundError:
            gone = BatchError(code="file_not_found", message="the input file was deleted",
                              param="input_file_id")  # fmt: skip
            failed = functools.partial(
                _with, status="failed", failed_at=now, errors=BatchErrors(data=[gone])
            )
            await self._book.change(batch.id, failed)
            self._meters.batch_ended("failed")
            return None
        checked = check_input(
            data,
            endpoint=batch.endpoint,
            # Validated once: a line is never dropped later because, say, its model's
            # workers are away for a moment (it then fails on its own, in the error file).
            check_body=self._body_checks(batch.endpoint, batch.tenant) if validating else None,
            max_lines=self._limits.max_lines,
            max_body_bytes=self._limits.max_body_bytes,
        )
        if not validating:
            return checked.lines
        if checked.errors:
            await self._book.change(
                batch.id,
                lambda r: _with(
                    r, status="failed", failed_at=now, errors=BatchErrors(data=checked.errors)
                ),
            )
            self._meters.batch_ended("failed")
            return None
        counts = RequestCounts(total=len(checked.lines))
        await self._book.change(
            batch.id,
            lambda r: (
                _with(r, status="in_progress", in_progress_at=now, request_counts=counts)
                if r.batch.status == "validating"
                else None
            ),
        )
        return checked.lines

    async def _send(self, record: BatchRecord, lines: list[InputLine], stop: asyncio.Event) -> None:
        batch = record.batch
        kept = await self._state.batch_lines(batch.id)
        counts = _counts(len(lines), kept.values())
        pacer = LinePacer(cap=self._limits.max_in_flight, initial=_INITIAL_LINES)
        pace = _Pace(pacer)
        for line in lines:
            if line.custom_id not in kept:
                pace.count(line.body, +1)
        tasks: set[asyncio.Task[None]] = set()
        finished: list[asyncio.Task[None]] = []

        async def one(line: InputLine, send: Send) -> None:
            answered = False
            try:
                outcome, send = await self._answered(batch, line, stop, pace, send)
                answered = outcome is not None
                if answered and await self._state.record_batch_line(
                    batch.id, line.custom_id, outcome.model_dump_json()
                ):
                    counts.completed += outcome.succeeded
                    counts.failed += not outcome.succeeded
                    self._meters.batch_line("succeeded" if outcome.succeeded else "failed")
                if answered:
                    pace.count(line.body, -1)
            finally:
                await pace.pacer.give_back(grew=answered, send=send)

        publisher = asyncio.create_task(self._publish_counts(batch, counts, pace))
        try:
            for line in lines:
                if line.custom_id in kept:
                    continue
                send = await pace.pacer.take()
                if stop.is_set():
                    await pace.pacer.give_back(grew=False, send=send)
                    break
                task = asyncio.create_task(one(line, send))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(finished.append)
            if tasks:
                await asyncio.wait(tasks)
        finally:
            publisher.cancel()
            self._meters.batch_progress(batch.id, None)
            for task in tasks:
                task.cancel()
        failed = [task.exception() for task in finished if not task.cancelled()]
        if any(failed):  # a line not kept (the state away): the batch is taken up again
            raise RuntimeError(f"{sum(map(bool, failed))} lines not kept") from next(
                e for e in failed if e
            )
        await self._book.change(batch.id, lambda r: _with(r, request_counts=counts))

    async def _answered(
        self, batch: Batch, line: InputLine, stop: asyncio.Event, pace: _Pace, send: Send
    ) -> tuple[OutputLine | None, Send]:
        """The line's outcome (None when the batch stopped while it waited for room), and
        its hold on a slot. Made to yield to interactive traffic, it goes again after a
        short wait that doubles (to Retry-After); the batch keeps its pace, since the
        queue already holds its lines back while prefill is busy. Refused for want of room
        otherwise (its queue wait ran out, decode KV, a tenant's rate limit), it halves
        the batch's lines in flight and goes again after Retry-After. A 5xx (a worker
        failed past the router's own retries) is tried again, up to ``failed_attempts``
        in all, before it is the line's outcome."""
        limits = self._limits
        backoff_s, wait_s, failures = limits.yield_wait_s, 0.5, 0
        while not stop.is_set():
            reply = await self._answer(line.url, line.body, batch.tenant, not pace.urgent)
            status = reply.status
            failures += status >= 500 and status not in _NO_ROOM
            if status not in _NO_ROOM and not (status >= 500 and failures < limits.failed_attempts):
                return _output(line, status, reply.body), send
            if reply.yielded:  # room comes back within a prefill or two: never wait long
                wait_s, backoff_s = backoff_s, min(reply.retry_after_s or 1.0, backoff_s * 2)
            else:
                if status in _NO_ROOM:
                    send = await pace.pacer.refused(send)
                wait_s = min(limits.retry_cap_s, reply.retry_after_s or wait_s * 2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait_s)
        return None, send

    async def _publish_counts(self, batch: Batch, counts: RequestCounts, pace: _Pace) -> None:
        """Every second: the counts and progress (the record, the metrics), and whether
        the batch is at risk of expiring. The first time it is, it is counted
        (``pdserve_batches_at_risk_total``, an alert). While it is, its share rises: its
        lines stop yielding to interactive traffic (they still queue behind it, as the
        lowest class), and at least half ``max_in_flight`` go at once."""
        started_s, done_before = self._now(), counts.completed + counts.failed
        recent: deque[tuple[float, int]] = deque(maxlen=_RATE_WINDOW_S)
        flagged = False
        while True:
            await asyncio.sleep(1.0)
            now_s, done = self._now(), counts.completed + counts.failed
            recent.append((now_s, done))
            risky = at_risk(now_s=now_s, started_s=started_s, done=done - done_before,
                            left=counts.total - done, expires_at=batch.expires_at)  # fmt: skip
            progress = BatchProgress(
                lines_per_s=_rate(recent), backlog_tokens=pace.backlog_tokens,
                pending={m: p.model_copy() for m, p in pace.pending.items() if p.lines > 0},
                seconds_left=None if batch.expires_at is None else batch.expires_at - now_s,
                in_flight=pace.pacer.in_flight, pace_limit=pace.pacer.limit,
            )  # fmt: skip
            self._meters.batch_progress(batch.id, progress)
            update = functools.partial(
                _published, counts=counts.model_copy(), risky=risky, progress=progress
            )
            await self._book.change(batch.id, update)
            if risky and not flagged:
                flagged = True
                log.warning("batch %s is at risk of expiring: %s", batch.id, counts)
                self._meters.batch_at_risk()
            if risky != pace.urgent:  # its share follows the risk, both ways
                pace.urgent = risky
                await pace.pacer.raise_floor(self._limits.max_in_flight // 2 if risky else 1)

    async def _finish(self, batch_id: str, lines: list[InputLine]) -> None:
        record = await self._book.get(batch_id)
        if record is None or record.batch.status in ENDED:
            return
        batch = record.batch
        ending = {"cancelling": "cancelled"}.get(batch.status, "completed")
        if ending == "completed" and self._expired(record):
            ending = "expired"
        now = int(self._now())
        await self._book.change(
            batch_id,
            lambda r: (
                _with(r, status="finalizing", finalizing_at=now)
                if r.batch.status not in ENDED
                else None
            ),
        )
        kept = {
            cid: OutputLine.model_validate_json(raw)
            for cid, raw in (await self._state.batch_lines(batch_id)).items()
        }
        never_run = LineError(
            code=f"batch_{ending}", message=f"the batch was {ending} before this request ran"
        )
        outputs = [
            kept.get(line.custom_id)
            or OutputLine(id=_line_id(), custom_id=line.custom_id, error=never_run)
            for line in lines
        ]
        good = [o for o in outputs if o.succeeded]
        bad = [o for o in outputs if not o.succeeded]
        output_id = await self._write(batch, "output", good)
        error_id = await self._write(batch, "error", bad)
        counts = RequestCounts(total=len(lines), completed=len(good), failed=len(bad))
        done_at = int(self._now())
        await self._book.change(
            batch_id,
            lambda r: _with(
                r,
                status=ending,
                output_file_id=output_id,
                error_file_id=error_id,
                request_counts=counts,
                **{f"{ending}_at": done_at},
            ),
        )
        await self._state.drop_batch_lines(batch_id)
        self._meters.batch_ended(ending)
        log.info("batch %s %s: %d ok, %d failed", batch_id, ending, len(good), len(bad))

    async def _write(self, batch: Batch, kind: str, outputs: list[OutputLine]) -> str | None:
        if not outputs:
            return None
        digest = hashlib.sha256(f"{batch.id}/{kind}".encode()).hexdigest()[:24]
        meta = FileObject(
            id=f"file-{digest}",
            bytes=0,
            created_at=int(self._now()),
            filename=f"{batch.id}_{kind}.jsonl",
            purpose="batch_output",
            tenant=batch.tenant,
        )
        await self._files.put(meta, _jsonl(outputs))
        return meta.id


@dataclass(slots=True)
class _Pace:
    """A running batch's pacing: its lines in flight, whether it is at risk of expiring
    (then its lines no longer yield to interactive traffic), and its backlog."""

    pacer: LinePacer
    pending: dict[str, PendingLines] = field(default_factory=dict)  # by model
    urgent: bool = False

    def count(self, body: dict, sign: int) -> None:
        """A line joins (+1) or leaves (-1, answered) the backlog."""
        prompt, output = _tokens_at_most(body)
        part = self.pending.setdefault(str(body.get("model", "")), PendingLines())
        part.lines += sign
        part.prompt_tokens += sign * prompt
        part.output_tokens += sign * output

    @property
    def backlog_tokens(self) -> int:
        return max(0, sum(p.prompt_tokens + p.output_tokens for p in self.pending.values()))


class BatchMeters(Protocol):
    """Where a runner reports (``RouterMetrics``)."""

    def batch_line(self, outcome: str) -> None: ...
    def batch_ended(self, status: str) -> None: ...
    def batch_at_risk(self) -> None: ...
    def batch_statuses(self, counts: Mapping[str, int]) -> None: ...
    def batch_progress(self, batch_id: str, progress: BatchProgress | None) -> None: ...


class _NoMeters:
    def batch_line(self, outcome: str) -> None:
        pass

    def batch_ended(self, status: str) -> None:
        pass

    def batch_at_risk(self) -> None:
        pass

    def batch_statuses(self, counts: Mapping[str, int]) -> None:
        pass

    def batch_progress(self, batch_id: str, progress: BatchProgress | None) -> None:
        pass


def at_risk(
    *, now_s: float, started_s: float, done: int, left: int, expires_at: int | None,
    min_elapsed_s: float = 5.0,
) -> bool:  # fmt: skip
    """Whether, at the pace since ``started_s`` (``done`` lines), the ``left`` lines end
    past ``expires_at``. Not judged before ``min_elapsed_s``. With no line done yet, at
    risk once the time gone without one is as long as the time left."""
    elapsed_s = now_s - started_s
    if expires_at is None or left <= 0 or elapsed_s < min_elapsed_s:
        return False
    if done <= 0:
        return elapsed_s >= expires_at - now_s
    return now_s + left * elapsed_s / done > expires_at


def _published(
    record: BatchRecord, *, counts: RequestCounts, risky: bool, progress: BatchProgress
) -> BatchRecord:
    update = {"at_risk": risky, "progress": progress}
    return _with(record, request_counts=counts).model_copy(update=update)


def _rate(recent: deque[tuple[float, int]]) -> float:
    """Lines per second between the oldest and newest (time, lines done) seen."""
    (first_s, first), (last_s, last) = recent[0], recent[-1]
    return (last - first) / (last_s - first_s) if last_s > first_s else 0.0


def _tokens_at_most(body: dict) -> tuple[int, int]:
    """A line's (prompt, output) tokens, estimated high without its tokenizer: its
    prompt's characters (4 a token, less for most text) and its output cap."""
    prompt = body.get("prompt") or body.get("messages") or body.get("input") or ""
    chars = len(prompt) if isinstance(prompt, str) else len(json.dumps(prompt))
    output = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return chars // 4, output if isinstance(output, int) else 0


def _with(record: BatchRecord, **changes: object) -> BatchRecord:
    return record.model_copy(update={"batch": record.batch.model_copy(update=changes)})


def _counts(total: int, kept: Iterable[str]) -> RequestCounts:
    outcomes = [OutputLine.model_validate_json(raw) for raw in kept]
    good = sum(o.succeeded for o in outcomes)
    return RequestCounts(total=total, completed=good, failed=len(outcomes) - good)


def _line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def _output(line: InputLine, status: int, body: bytes) -> OutputLine:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = body.decode(errors="replace")
    request_id = parsed.get("id") if isinstance(parsed, dict) and "id" in parsed else _line_id()
    return OutputLine(
        id=_line_id(),
        custom_id=line.custom_id,
        response=LineResponse(status_code=status, request_id=str(request_id), body=parsed),
    )


async def _jsonl(outputs: list[OutputLine]) -> AsyncIterator[bytes]:
    for start in range(0, len(outputs), 256):
        yield b"".join(o.model_dump_json().encode() + b"\n" for o in outputs[start : start + 256])
