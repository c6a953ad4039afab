"""Imports flow one way (ARCHITECTURE.md): cli on top; localrun, benchmarks, loadgen, sim,
router and the agent (its roles in agent/roles) in the middle; contracts, kvtransfer and
modelstore at the bottom. Every import counts, the lazy ones inside functions and the ones under
``TYPE_CHECKING`` too. Inside a folder, modules form no loop either, and nothing in the
router imports its app (``router.http.app``) but the server that runs it.

Each rule is a function over a tree, so the tests below also plant a violation in a
small tree of their own and watch the rule catch it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOTTOM = {"contracts", "kvtransfer", "modelstore"}
MIDDLE = {"localrun", "benchmarks", "loadgen", "sim", "router", "agent"}
# What each middle folder may not import, beyond the rules every folder follows.
FORBIDDEN: dict[str, set[str]] = {
    # The sim is an engine: it knows nothing of who drives or measures it.
    "sim": {"agent", "benchmarks", "loadgen", "localrun", "router"},
    # The agent (and its roles) picks the engine kind through facts handed in (SimFacts),
    # never the sim.
    "agent": {"sim", "router", "benchmarks", "loadgen", "localrun"},
    # The router never imports worker internals.
    "router": {"agent", "sim", "benchmarks", "loadgen", "localrun"},
    # The load generator works against any endpoint (calibration aside: EXCEPTIONS).
    "loadgen": {"router", "agent", "sim", "benchmarks", "localrun"},
    # The scripts work against any endpoint (router micro-benchmarks aside: EXCEPTIONS).
    "benchmarks": {"router"},
    "localrun": {"benchmarks", "loadgen", "router"},
}
# Modules (a name covers the modules under it) that may import some of what their folder
# may not, each named with what it may import.
EXCEPTIONS: dict[str, set[str]] = {
    # `pdserve sim calibrate` starts a real engine (the agent's EngineSpec, localrun) and
    # fits a sim profile to what it measures.
    "loadgen.calibrate_cli": {"agent", "localrun", "sim"},
    "loadgen.calibration": {"sim"},
    # Micro-benchmarks of router internals time the router's own classes in-process.
    "benchmarks.router_micro": {"router"},
    # The planner benchmark runs the router's planner in-process against sim fleets.
    "benchmarks.planner": {"router"},
    # ... and its model check predicts with the router's planner model beside the replay.
    "benchmarks.planner_model_check": {"router"},
}
FOLDERS = BOTTOM | MIDDLE | {"cli"}


def imported_names(path: Path) -> list[str]:
    """Every absolute import in a file, as dotted names (``from a.b import c``: a.b, a.b.c)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def imports_by_folder(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """folder -> imported pdserve folder -> the files that import it."""
    graph: dict[str, dict[str, list[str]]] = {}
    for folder in sorted(FOLDERS):
        for path in sorted((root / folder).rglob("*.py")):
            for name in imported_names(path):
                target = name.split(".")[0]
                if target in FOLDERS and target != folder:
                    files = graph.setdefault(folder, {}).setdefault(target, [])
                    files.append(str(path.relative_to(root)))
    return graph


def excused(file: str, target: str) -> bool:
    """Whether EXCEPTIONS lets this file (a path from the root) import ``target``."""
    module = ".".join(Path(file).with_suffix("").parts)
    return any(
        target in allowed and (module == name or module.startswith(f"{name}."))
        for name, allowed in EXCEPTIONS.items()
    )


def against_the_arrows(root: Path = ROOT) -> list[str]:
    wrong = []
    for folder, targets in imports_by_folder(root).items():
        for target, files in targets.items():
            if target == "cli" or (folder in BOTTOM and target not in BOTTOM):
                against = files
            elif target in FORBIDDEN.get(folder, set()):
                against = [file for file in files if not excused(file, target)]
            else:
                against = []
            if against:
                wrong.append(f"{folder} -> {target}: {sorted(set(against))}")
    return wrong


def module_graph(root: Path, folder: str) -> dict[str, set[str]]:
    """module -> the modules of the same folder it imports (a package counts as its
    ``__init__``)."""
    modules = {}
    for path in (root / folder).rglob("*.py"):
        dotted = path.relative_to(root).with_suffix("").parts
        modules[".".join(dotted[:-1] if dotted[-1] == "__init__" else dotted)] = path
    return {
        module: {name for name in imported_names(path) if name in modules and name != module}
        for module, path in modules.items()
    }


def a_loop(graph: dict[str, set[str]]) -> list[str] | None:
    """One loop of the graph, as the path around it; None when there is none."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path, node, target]
            if target not in state and (loop := visit(target, [*path, node])):
                return loop
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (loop := visit(node, [])):
            return loop
    return None


def importers_of_the_app(root: Path = ROOT) -> list[str]:
    graph = module_graph(root, "router")
    return sorted(m for m, targets in graph.items() if "router.http.app" in targets and
                  m != "router.http.server")  # fmt: skip


def below_importing_http(root: Path = ROOT) -> list[str]:
    """Router modules outside ``router.http`` that import it: the HTTP layer is the top
    floor, so the stages and the control plane never reach up into it."""
    graph = module_graph(root, "router")
    return sorted(
        f"{m} -> {t}" for m, targets in graph.items() if not m.startswith("router.http")
        for t in targets if t == "router.http" or t.startswith("router.http.")
    )  # fmt: skip


def test_no_import_runs_against_the_arrows():
    wrong = against_the_arrows()
    assert wrong == [], "\n".join(wrong)


def test_folders_form_no_cycle():
    graph = {folder: set(targets) for folder, targets in imports_by_folder().items()}
    assert a_loop(graph) is None


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_modules_of_a_folder_form_no_loop(folder: str):
    assert a_loop(module_graph(ROOT, folder)) is None


def test_nothing_imports_the_app_but_the_server():
    assert importers_of_the_app() == []


def test_nothing_below_the_http_layer_imports_it():
    assert below_importing_http() == []


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_import_against_the_arrows_is_caught(tmp_path: Path):
    tree = plant(tmp_path, {"contracts/a.py": "from router.settings import X\n",
                            "sim/b.py": "def f():\n    import agent.runner\n",
                            "router/c.py": "import contracts.a\n"})  # fmt: skip
    wrong = against_the_arrows(tree)
    assert [line.split(":")[0] for line in wrong] == ["contracts -> router", "sim -> agent"]


def test_only_the_named_modules_are_excused(tmp_path: Path):
    tree = plant(tmp_path, {"loadgen/calibrate_cli.py": "import sim.profile\n",
                            "loadgen/calibration.py": "from localrun.ports import free_ports\n",
                            "loadgen/bench_cli.py": "from sim.profile import load_profile\n",
                            "sim/profile.py": "", "localrun/ports.py": ""})  # fmt: skip
    assert sorted(against_the_arrows(tree)) == ["loadgen -> localrun: ['loadgen/calibration.py']",
                     "loadgen -> sim: ['loadgen/bench_cli.py']"]  # fmt: skip


def test_only_router_micro_benchmarks_may_import_the_router(tmp_path: Path):
    tree = plant(tmp_path, {"benchmarks/router_micro/lookup.py": "import router.scheduling\n",
                            "benchmarks/router_cpu.py": "from router.settings import X\n",
                            "benchmarks/router_microscope.py": "import router\n",
                            "router/settings.py": "", "router/scheduling.py": ""})  # fmt: skip
    assert against_the_arrows(tree) == [
        "benchmarks -> router: ['benchmarks/router_cpu.py', 'benchmarks/router_microscope.py']"
    ]


def test_a_planted_type_checking_loop_is_caught(tmp_path: Path):
    tree = plant(tmp_path, {
        "router/__init__.py": "",
        "router/http/__init__.py": "",
        "router/http/app.py": "from router.http.access import guarded\n",
        "router/http/access.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from router.http.app import Parts\n",
        "router/http/server.py": "from router.http.app import create_app\n",
        "router/fleet/__init__.py": "",
        "router/fleet/registry.py": "from router.http.access import guarded\n",
    })  # fmt: skip
    loop = a_loop(module_graph(tree, "router"))
    assert loop is not None and loop[-3:] == ["router.http.access", "router.http.app",
                                              "router.http.access"]  # fmt: skip
    assert importers_of_the_app(tree) == ["router.http.access"]
    assert below_importing_http(tree) == ["router.fleet.registry -> router.http.access"]
