"""Every benchmark result records its machine, and ``pdserve bench``'s report shows it."""

from __future__ import annotations

import ast
from pathlib import Path

from contracts.machine import SPEED_FLAGS, describe, machine_record, read_cpu
from loadgen.client import RequestResult
from loadgen.metrics import summarize
from loadgen.report import write_report

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_names_cpu_flags_cores_and_commit():
    record = machine_record()
    assert record["cpu_model"] == read_cpu().model
    assert set(record["cpu_flags"]) == set(SPEED_FLAGS)
    assert record["cores"] >= 1
    assert record["commit"] and len(record["commit"]) == 12  # this checkout is a git repo
    line = describe(record)
    assert record["cpu_model"] in line and f"{record['cores']} cores" in line


def test_every_benchmark_that_writes_a_result_records_the_machine():
    """A script that writes a JSON result (or a profile) calls machine_record()."""
    writers = []
    for path in sorted([*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "loadgen").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}  # fmt: skip
        if "dumps" in calls and ("write_text" in calls or "write_bytes" in calls):
            writers.append((path.name, "machine_record" in calls))
    assert len(writers) >= 10
    assert [name for name, records in writers if not records] == []


def test_the_bench_report_shows_each_runs_machine(tmp_path):
    machine = machine_record()
    sample = {"start_s": 0.0, "status": 200, "error": None, "ttft_ms": 50.0, "tpot_ms": 5.0,
              "e2e_ms": 100.0, "output_tokens": 10}  # fmt: skip
    result = RequestResult(started_s=0.0, ttft_s=0.05, e2e_s=0.1, output_tokens=10, status=200)
    run = {"label": "r", "series": "s", "offered_rps": 1.0, "command": "pdserve bench x",
           "machine": machine, "summary": summarize([result]), "samples": [sample]}  # fmt: skip
    page = write_report([run, {**run, "label": "old", "machine": None}], tmp_path).read_text()
    assert describe(machine) in page
    assert "machine not recorded" in page  # a result from before machines were recorded
