"""Every third-party import in pdserve's packages is a declared dependency.

A module imported at the top of a file must be in ``dependencies`` (an install of
pdserve alone must run the router, the sim, the agents and the benchmarks); one
imported inside a function may be in an extra instead (the engine, model
preparation, dev tools). A dependency that only arrived through vLLM (uvicorn's
httptools, once) fails here, not on a machine without vLLM.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contracts", "kvtransfer", "modelstore", "router", "agent", "sim", "loadgen",
            "benchmarks", "cli", "localrun")  # fmt: skip
# Files that run inside the engine's interpreter, where vLLM and NIXL are installed.
ENGINE_SIDE = {ROOT / "agent" / "engine_site" / "sitecustomize.py"}


def _names(requirements: list[str]) -> set[str]:
    return {
        re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level imports, imports inside functions) of one file, as root module names."""
    tree = ast.parse(path.read_text())
    top, nested = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {node.module.split(".")[0]}
        else:
            continue
        (top if node in tree.body else nested).update(names)
    return top, nested


def test_every_third_party_import_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = _names(project["dependencies"])
    extras = set().union(*(_names(v) for v in project["optional-dependencies"].values()))
    distributions = importlib.metadata.packages_distributions()
    ours = set(PACKAGES) | {"tests"}
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in ENGINE_SIDE:
                continue
            top, nested = _imports(path)
            for module in top | nested:
                if module in ours or module in sys.stdlib_module_names:
                    continue
                dists = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
                allowed = required if module in top else required | extras
                if not dists & allowed:
                    where = "top level" if module in top else "in a function"
                    missing.append(f"{path.relative_to(ROOT)}: {module} ({where}) from {dists}")
    assert missing == [], "\n".join(missing)
