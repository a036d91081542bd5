"""Dependencies point one way: schedules <- runs <- dispatch <- the HTTP surface
(scheduler_project.web), with scheduler_project's pure helpers (no models, no apps) below them all.

Read from the source (every import statement, at any depth, including ones inside functions), so a
lazy import cannot hide an upward dependency."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Rank of each layer: a module may import only layers of lower or equal rank.
HELPERS, SCHEDULES, RUNS, DISPATCH, WEB, PROJECT = range(6)
# The project's configuration (settings, URLs, WSGI) sits on top and may import anything.
PROJECT_MODULES = {"scheduler_project.settings", "scheduler_project.settings_test", "scheduler_project.urls",
                   "scheduler_project.wsgi", "scheduler_project"}


def layer(module: str) -> int | None:
    if module in PROJECT_MODULES:
        return PROJECT
    top = module.split(".")[0]
    if module.startswith("scheduler_project.web"):
        return WEB
    return {"scheduler_project": HELPERS, "schedules": SCHEDULES, "runs": RUNS, "dispatch": DISPATCH}.get(top)


def modules():
    for package in ("scheduler_project", "schedules", "runs", "dispatch"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def imported(path: Path, module: str):
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name
            for alias in node.names:
                yield f"{name}.{alias.name}"


ALL = list(modules())


@pytest.mark.parametrize("module,path", ALL, ids=[m for m, _ in ALL])
def test_no_module_imports_a_layer_above_its_own(module, path):
    own = layer(module)
    upward = sorted({name for name in imported(path, module) if (layer(name) or 0) > own})
    assert not upward, f"{module} (layer {own}) imports from a layer above it: {upward}"


def test_the_layers_are_all_known():
    assert {layer(m) for m, _ in ALL} == {HELPERS, SCHEDULES, RUNS, DISPATCH, WEB, PROJECT}
