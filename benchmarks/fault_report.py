"""The fault matrix as a reader sees it: a Markdown table and a picture."""

from __future__ import annotations

import statistics
from pathlib import Path

OUTCOMES = ("complete", "error", "truncated", "hang", "cut")
_COLORS = {"complete": "tab:green", "error": "tab:orange", "truncated": "tab:red",
           "hang": "black", "cut": "tab:purple"}  # fmt: skip


def recovery(scenario: dict, key: str) -> tuple[float | None, float | None, int]:
    """Median and worst of one recovery time over the injections, and how many never
    recovered within the suite's limit (counted, not dropped)."""
    values = [i[key] for i in scenario["injections"] if i[key] is not None]
    missing = len(scenario["injections"]) - len(values)
    if not values:
        return None, None, missing
    return statistics.median(values), max(values), missing


def markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [
        f"# {report['title']}", "",
        f"`{report['command']}` on {report['date']}, commit {machine.get('commit', '?')}, "
        f"{machine.get('cpu_model', '?')} ({machine.get('cores', '?')} cores); "
        f"{report['clients']} closed-loop clients streaming greedy completions.", "",
        "Every request started during a scenario: complete (the recorded answer), error "
        "(a clear error), truncated (a 200 cut short or wrong: never allowed), hang (no byte "
        "for 30 s: never allowed), cut (the connection broke with no SSE error event: "
        "allowed only for a killed router's own clients). Served again: until a request sent "
        "after the injection completed; whole: until every worker, router replica and Redis "
        "was back (median / worst). Longest "
        "wait: the longest any client waited for its next token (or its first). KV: "
        "the slowest engine's return to its idle KV usage once the load stopped.", "",
        "| scenario | injections | requests | complete | error | truncated | hang | cut "
        "| longest wait (s) | served again (s) | whole (s) | KV back (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for s in report["scenarios"]:
        counts = s["outcomes"]
        served, whole = recovery(s, "served_s"), recovery(s, "whole_s")
        kv = max(s["kv_settled_s"].values(), default=0.0)
        lines.append(
            f"| {s['scenario']} | {len(s['injections'])} | {s['requests']} | "
            + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES)
            + f" | {s['worst_wait_s']} | {_span(served)} | {_span(whole)} | {kv:g} |"
        )
    lines += [
        "",
        "Outcomes by the router replica each client talked to "
        "(complete / error / truncated / hang / cut):",
        "",
    ]
    lines += [
        f"- `{s['scenario']}`: " + "; ".join(
            f"replica {i}: " + " / ".join(str(c[o]) for o in OUTCOMES)
            for i, c in enumerate(s.get("outcomes_by_replica", [])))
        for s in report["scenarios"]
    ]  # fmt: skip
    counted = [s for s in report["scenarios"] if s.get("router_counted")]
    if counted:
        lines += ["", "What the first router replica counted during each scenario (stall "
                  "checks that found the engine alive / hung, streams migrated, held KV "
                  "released / with no decode to release through / failed, circuits "
                  "opened):", ""]  # fmt: skip
        lines += [
            f"- `{s['scenario']}`: " + ", ".join(f"{k} {v}" for k, v in s["router_counted"].items())
            for s in counted
        ]
    lines += ["", "What each scenario injects:", ""]
    lines += [f"- `{s['scenario']}`: {s['what']}" for s in report["scenarios"]]
    errors = [(s["scenario"], e, n) for s in report["scenarios"] for e, n in s["errors"].items()]
    if errors:
        lines += ["", "Requests not complete, by scenario and error:", ""]
        lines += [f"- `{name}`: {n} x `{error or 'wrong text'}`" for name, error, n in errors]
    return "\n".join(lines) + "\n"


def _span(values: tuple[float | None, float | None, int]) -> str:
    median, worst, missing = values
    text = "-" if median is None else f"{median:.1f} / {worst:.1f}"
    return text + (f" ({missing} never)" if missing else "")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = report["scenarios"]
    names = [s["scenario"] for s in scenarios]
    figure, (matrix, times) = plt.subplots(1, 2, figsize=(13, 0.5 * len(names) + 2.5))
    left = [0.0] * len(names)
    for outcome in OUTCOMES:
        shares = [s["outcomes"].get(outcome, 0) / max(1, s["requests"]) for s in scenarios]
        matrix.barh(names, shares, left=left, color=_COLORS[outcome], label=outcome)
        left = [a + b for a, b in zip(left, shares, strict=True)]
    matrix.set_xlim(0, 1)
    matrix.set_xlabel("share of the requests sent during the scenario")
    matrix.invert_yaxis()
    matrix.legend(loc="lower right", fontsize=8)
    matrix.set_title("client outcomes")
    for row, s in enumerate(scenarios):
        for offset, key in ((-0.15, "served_s"), (0.15, "whole_s")):
            values = [i[key] for i in s["injections"] if i[key] is not None]
            times.scatter(values, [row + offset] * len(values), s=10,
                          color="tab:blue" if key == "served_s" else "tab:gray")  # fmt: skip
    times.scatter([], [], color="tab:blue", label="served again")
    times.scatter([], [], color="tab:gray", label="every worker back")
    times.set_yticks(range(len(names)), names)
    times.invert_yaxis()
    times.set_xlabel("seconds after each injection")
    times.legend(loc="lower right", fontsize=8)
    times.set_title("recovery, per injection")
    figure.suptitle(report["title"])
    figure.tight_layout()
    figure.savefig(path, dpi=110)
