"""Imports flow one way (ARCHITECTURE.md): cli on top; localrun, benchmarks, sim, router and
the agent (with prefill and decode) in the middle; contracts, kvtransfer and modelstore
at the bottom. Every import counts, the lazy ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOTTOM = {"contracts", "kvtransfer", "modelstore"}
MIDDLE = {"localrun", "benchmarks", "sim", "router", "agent", "prefill", "decode"}
AGENT = {"agent", "prefill", "decode"}
# What each middle folder may not import, beyond the rules every folder follows.
FORBIDDEN: dict[str, set[str]] = {
    # The sim is an engine: it knows nothing of who drives or measures it.
    "sim": {"agent", "prefill", "decode", "benchmarks", "localrun", "router"},
    # Agents pick the engine kind through facts handed in (SimFacts), never the sim.
    **{role: {"sim", "router", "benchmarks", "localrun"} for role in AGENT},
    # The router never imports worker internals.
    "router": {"agent", "prefill", "decode", "sim", "benchmarks", "localrun"},
    # The harness works against any endpoint; router micro-benchmarks live in router/.
    "benchmarks": {"router"},
    "localrun": {"benchmarks", "router"},
}
FOLDERS = BOTTOM | MIDDLE | {"cli"}


def imports_by_folder() -> dict[str, dict[str, list[str]]]:
    """folder -> imported pdserve folder -> the files that import it."""
    graph: dict[str, dict[str, list[str]]] = {}
    for folder in sorted(FOLDERS):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    target = name.split(".")[0]
                    if target in FOLDERS and target != folder:
                        files = graph.setdefault(folder, {}).setdefault(target, [])
                        files.append(str(path.relative_to(ROOT)))
    return graph


def test_no_import_runs_against_the_arrows():
    wrong = []
    for folder, targets in imports_by_folder().items():
        for target, files in targets.items():
            against = (
                target == "cli"
                or (folder in BOTTOM and target not in BOTTOM)
                or target in FORBIDDEN.get(folder, set())
            )
            if against:
                wrong.append(f"{folder} -> {target}: {sorted(set(files))}")
    assert wrong == [], "\n".join(wrong)


def test_folders_form_no_cycle():
    graph = {folder: set(targets) for folder, targets in imports_by_folder().items()}
    state: dict[str, str] = {}

    def visit(folder: str, path: list[str]) -> list[str] | None:
        state[folder] = "open"
        for target in sorted(graph.get(folder, ())):
            if state.get(target) == "open":
                return [*path, folder, target]
            if target not in state and (cycle := visit(target, [*path, folder])):
                return cycle
        state[folder] = "done"
        return None

    for folder in sorted(graph):
        if folder not in state:
            assert visit(folder, []) is None
