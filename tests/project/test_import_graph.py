"""Arrows one way: the package's folders import each other without a cycle.

Every `import` and `from ... import` of every module is read with `ast` (function-level imports included, since
they are arrows too). A module belongs to the top folder of the package it sits in (`engine`, `drafters`, ...;
`.` for the modules at the package root). Layers call down: the engine owns the `Drafter` protocol that drafters
implement, drafters never import a backend, and so on; a cycle between folders means some arrow points up.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import assisted_backends

PACKAGE = Path(assisted_backends.__file__).parent
NAME = PACKAGE.name


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The package modules `path` imports anywhere in its body (relative imports resolved)."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {name for name in found if name == NAME or name.startswith(f"{NAME}.")}


def folder(module: str) -> str | None:
    """The top folder of the package `module` belongs to ("." for a root module), None for the package itself."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    if (PACKAGE / parts[0]).is_dir():
        return parts[0]
    return "."


# the layers a call runs through, and the kernels
CALL_LAYERS = (".", "api", "options", "engine", "drafters", "quantized")
# the front ends, what they share, and the loading room they open models through
FRONT_LAYERS = ("serve", "cli", "train_draft", "startup", "loading")


def module_graph(folders: tuple[str, ...]) -> dict[str, dict[str, list[str]]]:
    """module -> imported module, for the modules of `folders` (each arrow listed once)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        if folder(source) not in folders:
            continue
        for target in imported_modules(path):
            if (
                target != source
                and not _packages_it(target, source)
                and folder(target) in folders
                and _is_module(target)
            ):
                graph[source][target].append(f"{source} -> {target}")
    return graph


def _packages_it(package: str, module: str) -> bool:
    """Whether `package` holds `module` (`from pkg import sibling` names it: initialised before the module anyway)."""
    return module.startswith(f"{package}.")


def _is_module(name: str) -> bool:
    """Whether `name` is a module or package of this package (not a name imported from one)."""
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative / "__init__.py").exists()


def folder_graph() -> dict[str, dict[str, list[str]]]:
    """folder -> imported folder -> the imports that make the arrow ("module -> module")."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        for target in imported_modules(path):
            here, there = folder(source), folder(target)
            if here and there and here != there:
                graph[here][there].append(f"{source} -> {target}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one folder (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_reader_sees_function_level_and_relative_imports(tmp_path):
    assert "assisted_backends.engine.drafter" in imported_modules(PACKAGE / "engine" / "round.py")
    assert folder("assisted_backends.hf_compat") == "." and folder("assisted_backends.engine.loop") == "engine"
    graph = {"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "assisted_backends.cli" in imported_modules(PACKAGE / "cli" / "main.py")  # `from ..cli import prompting`
    assert "assisted_backends.cli" not in module_graph(("cli",))["assisted_backends.cli.main"]  # its own package


def test_no_cycle_between_package_folders():
    graph = folder_graph()
    found = cycles(graph)
    arrows = {
        f"{a} -> {b}": graph[a][b][:3] for component in found for a in component for b in component if b in graph[a]
    }
    assert not found, f"folders importing each other: {found}; arrows: {arrows}"


def test_the_engine_imports_no_drafter_and_no_drafter_imports_a_backend():
    graph = folder_graph()
    assert "drafters" not in graph["engine"], graph["engine"]["drafters"]
    assert "backends" not in graph["drafters"], graph["drafters"]["backends"]


def test_no_two_modules_of_a_call_import_each_other():
    """Within the layers a call runs through, no module cycle either (`api.generation` calls `api.queue`, which
    reaches its caller only through the `Planner` protocol)."""
    found = cycles(module_graph(CALL_LAYERS))
    assert not found, f"modules importing each other: {found}"


def diagram_order() -> dict[str, int]:
    """folder -> its line in docs/design.md's layering diagram ("." for the root modules' line)."""
    page = (PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8")
    block = page.split("## Layering", 1)[1].split("```", 2)[1]
    order: dict[str, int] = {}
    for index, line in enumerate(block.splitlines()):
        names = line.split("  ", 1)[0].strip()
        for name in filter(None, (part.strip() for part in names.split(","))):
            order[name.rstrip("/") if name.endswith("/") else "."] = index
    return order


def test_the_layer_diagram_matches_the_imports():
    """docs/design.md lists the folders top to bottom; every import points to a folder listed lower."""
    order = diagram_order()
    graph = folder_graph()
    assert set(graph) | {b for a in graph for b in graph[a]} <= set(order), sorted(set(graph) - set(order))
    upward = {f"{a} -> {b}": arrows[:2] for a in graph for b, arrows in graph[a].items() if order[b] <= order[a]}
    assert not upward, f"imports pointing up the diagram: {upward}"


def test_no_two_modules_of_the_front_ends_or_the_loading_room_import_each_other():
    """`serve.cli` checks the flags and calls `serve.server`, which never calls back; `cli/` and `serve/` open their
    models through `startup/`, which opens each through `loading.open`; nothing below calls back up."""
    found = cycles(module_graph(FRONT_LAYERS))
    assert not found, f"modules importing each other: {found}"


def test_the_server_builds_on_the_api_and_the_loading_room_not_on_the_command_line():
    graph = folder_graph()
    assert "cli" not in graph["serve"], graph["serve"]["cli"]
    assert {"api", "startup"} <= set(graph["serve"]) and "loading" in graph["startup"]


def test_the_loading_room_calls_no_front_end_and_no_api():
    reached = set(folder_graph()["loading"])
    assert not reached & {"serve", "cli", "train_draft", "startup", "api"}, reached
