"""Dependencies point one way, package by package:

    foundation < schedules < runs < dispatch < web < configuration

`scheduler_project.foundation` holds the helpers every app uses and imports no app; the HTTP
surface (`scheduler_project.web`) sits above the domain apps; the configuration (settings, URLs,
WSGI, gunicorn's configuration, the DATABASE_URL parser, and the web's management commands) is on
top and may import anything.

Read from the source: every import statement at any depth (a lazy import inside a function cannot
hide an upward dependency), and every `__import__("...")` or `importlib.import_module("...")` call,
whose name must be a literal so it can be checked."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scheduler_project", "schedules", "runs", "dispatch")

FOUNDATION, SCHEDULES, RUNS, DISPATCH, WEB, CONFIGURATION = range(6)
NAMES = {FOUNDATION: "foundation", SCHEDULES: "schedules", RUNS: "runs", DISPATCH: "dispatch", WEB: "web",
         CONFIGURATION: "configuration"}
CONFIGURATION_MODULES = {
    "scheduler_project",
    "scheduler_project.settings",
    "scheduler_project.settings_test",
    "scheduler_project.urls",
    "scheduler_project.wsgi",
    "scheduler_project.gunicorn_conf",
    "scheduler_project.database_url",
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer(module: str) -> int | None:
    """The layer a module belongs to, or None for a module outside the project (Django, the stdlib)."""
    if module in CONFIGURATION_MODULES or _within(module, "scheduler_project.web.management"):
        return CONFIGURATION
    if _within(module, "scheduler_project.foundation"):
        return FOUNDATION
    if _within(module, "scheduler_project.web"):
        return WEB
    top = module.split(".")[0]
    if top == "scheduler_project":
        # A module directly under scheduler_project that is not configuration: it must be given a
        # place (foundation below the apps, or web above them) before it can be imported.
        return -1
    return {"schedules": SCHEDULES, "runs": RUNS, "dispatch": DISPATCH}.get(top)


def modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def _dynamic_import_name(node: ast.Call) -> str | None | bool:
    """The module a call imports: a name for `__import__("x")` / `importlib.import_module("x")` /
    `import_module("x")`, False for such a call with a computed name, None for any other call."""
    func = node.func
    if isinstance(func, ast.Name) and func.id in {"__import__", "import_module"}:
        pass
    elif isinstance(func, ast.Attribute) and func.attr == "import_module":
        pass
    else:
        return None
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return False


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
        elif isinstance(node, ast.Call):
            name = _dynamic_import_name(node)
            if name is False:
                yield f"<computed import at {path.relative_to(ROOT)}:{node.lineno}>"
            elif name:
                yield name


ALL = list(modules())


def package_graph() -> dict[int, dict[int, set[str]]]:
    """Which layer imports which, with the importing modules: {from: {to: {module, ...}}}."""
    graph = defaultdict(lambda: defaultdict(set))
    for module, path in ALL:
        own = layer(module)
        for name in imported(path, module):
            other = layer(name)
            if other is not None and other != own:
                graph[own][other].add(module)
    return graph


@pytest.mark.parametrize("module,path", ALL, ids=[m for m, _ in ALL])
def test_no_module_imports_a_layer_above_its_own(module, path):
    own = layer(module)
    names = list(imported(path, module))
    computed = [name for name in names if name.startswith("<computed import")]
    assert not computed, f"{module} imports a module whose name is computed, which cannot be checked: {computed}"
    upward = sorted({name for name in names if (layer(name) or FOUNDATION) > own})
    assert not upward, f"{module} ({NAMES.get(own, 'no layer')}) imports from a layer above it: {upward}"


def test_every_module_has_a_layer():
    homeless = sorted(m for m, _ in ALL if layer(m) not in NAMES)
    assert not homeless, f"modules directly under scheduler_project that are neither configuration nor in foundation/ or web/: {homeless}"
    assert {layer(m) for m, _ in ALL} == set(NAMES)


def test_no_two_packages_import_each_other():
    graph = package_graph()
    both_ways = sorted((NAMES[a], NAMES[b]) for a in graph for b in graph[a] if a < b and a in graph.get(b, {}))
    assert not both_ways, f"packages that import each other: {both_ways}"


def test_the_foundation_imports_no_app_and_nothing_of_the_web():
    assert not package_graph().get(FOUNDATION), dict(package_graph()[FOUNDATION])
