"""How high a folder's modules stack: `quantized/` is at most 5 floors deep.

A module's floor is 1 when it imports no module of its own folder, else 1 + the highest floor among those it imports
(every `import` and `from ... import` read with `ast`, function-level ones included: `test_import_graph`'s reader).
A deep stack is a long chain a reader follows to understand the top module, and a change at the bottom ripples
through every floor above. `quantized/` once stood 10 floors high: the loader (`model`, importing the native decoder
in a function) over a 9-floor chain (native decoder -> fusion -> linear -> weights -> blocks -> gguf -> packing ->
int4_layout -> kernels).
"""

from __future__ import annotations

from test_import_graph import PACKAGE, imported_modules, module_name

MAX_FLOORS = {"quantized": 5}

# quantized/'s arrows before the native decoder moved to native/ and the chain was cut (10 floors)
OLD_QUANTIZED = {
    "native_decoder": {"blocks", "fusion", "linear"},
    "model": set(
        "blocks cache file_checks finite_values fusion gguf gguf_header hf_config int4_layout kernels linear "
        "native_decoder packing weights".split()
    ),
    "fusion": {"blocks", "linear"},
    "linear": {"blocks", "kernels", "packing", "weights"},
    "weights": {"blocks", "packing"},
    "blocks": {"gguf", "packing"},
    "gguf": {"gguf_header", "kernels", "packing"},
    "packing": {"int4_layout", "kernels"},
    "int4_layout": {"kernels"},
    "finite_values": {"file_checks"},
    "hf_config": {"file_checks", "gguf_header"},
    "file_checks": {"gguf_header"},
    "kernels": set(),
    "gguf_header": set(),
    "cache": set(),
}


def folder_arrows(folder: str) -> dict[str, set[str]]:
    """module -> the modules of the same folder it imports (short names; the package's `__init__` is no module
    here: it hands names on)."""
    directory = PACKAGE / folder
    modules = {path.stem: path for path in directory.glob("*.py") if path.name != "__init__.py"}
    prefix = f"{module_name(directory / '__init__.py')}."
    arrows: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {target.removeprefix(prefix) for target in imported_modules(path) if target.startswith(prefix)}
        arrows[name] = {target for target in targets if target in modules and target != name}
    return arrows


def floors(arrows: dict[str, set[str]]) -> dict[str, int]:
    """module -> its floor (1: imports none of the others); ValueError on a cycle."""
    found: dict[str, int] = {}
    visiting: set[str] = set()

    def floor(module: str) -> int:
        if module in found:
            return found[module]
        if module in visiting:
            raise ValueError(f"import cycle through {module}")
        visiting.add(module)
        found[module] = 1 + max((floor(target) for target in arrows.get(module, ())), default=0)
        visiting.discard(module)
        return found[module]

    for module in arrows:
        floor(module)
    return found


def tallest_chain(arrows: dict[str, set[str]]) -> list[str]:
    """The modules from the highest floor down to floor 1, each importing the next."""
    levels = floors(arrows)
    chain = [max(levels, key=lambda module: (levels[module], module))]
    while arrows.get(chain[-1]):
        chain.append(max(arrows[chain[-1]], key=lambda module: (levels[module], module)))
    return chain


def test_the_floor_count_reads_chains_and_refuses_cycles():
    assert floors({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == {"a": 3, "b": 2, "c": 1, "d": 2}
    assert tallest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]
    try:
        floors({"a": {"b"}, "b": {"a"}})
    except ValueError as error:
        assert "cycle" in str(error)
    else:
        raise AssertionError("a cycle was counted as floors")


def test_the_old_quantized_layout_stood_ten_floors_and_fails_the_limit():
    assert max(floors(OLD_QUANTIZED).values()) == 10 > MAX_FLOORS["quantized"]
    assert tallest_chain(OLD_QUANTIZED) == ["model", "native_decoder", "fusion", "linear", "weights", "blocks", "gguf",
                                            "packing", "int4_layout", "kernels"]  # fmt: skip


def test_the_reader_sees_a_folder_s_own_arrows():
    arrows = folder_arrows("quantized")
    assert "fusion" in arrows["model"] and "kernels" in arrows["packing"]
    assert all(not target.startswith("assisted_backends") for targets in arrows.values() for target in targets)


def test_quantized_stands_at_most_five_floors():
    for folder, limit in MAX_FLOORS.items():
        arrows = folder_arrows(folder)
        chain = tallest_chain(arrows)
        assert len(chain) <= limit, f"{folder}/ stands {len(chain)} floors high (limit {limit}): {' -> '.join(chain)}"
