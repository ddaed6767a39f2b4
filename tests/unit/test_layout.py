"""The package's layers (docs/architecture.md): config, then outputs, then run; each imports only those before it.

So the matrix can be loaded and checked without the code that writes files, and the files can
be written without the code that talks to an engine. builder/ has its own, stricter test
(test_builder_isolation.py).

Across the whole package, builder/ included: no import circle between modules, and no module
takes a private name from another.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fa_images"

# What each layer may import from the rest of fa_images (always itself, builder and errors).
ALLOWED = {
    "config": set(),
    "outputs": {"config"},
    "run": {"config", "outputs"},
}
LAYERS = set(ALLOWED)
COMMANDS = "commands"  # the command line's modules, one per command: at the top, above every layer


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(module: str, source: str, *, is_package: bool = False) -> set[str]:
    """Every fa_images module ``source`` imports, relative imports resolved, lazy imports included."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x` may name a module: count both the package and its members.
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "fa_images" or name.startswith("fa_images.")}


def layer_violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return []
    own = parts[1]
    return sorted(
        f"{module} imports {name}"
        for name in imported_modules(module, source, is_package=is_package)
        if len(name.split(".")) > 1
        and name.split(".")[1] in LAYERS | {COMMANDS}
        and name.split(".")[1] != own
        and name.split(".")[1] not in ALLOWED[own]
    )


def _package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "builder" not in p.relative_to(PACKAGE).parts)


def test_every_layer_imports_only_the_layers_before_it() -> None:
    problems = [
        v
        for path in _package_modules()
        for v in layer_violations(_module_name(path), path.read_text(), is_package=path.name == "__init__.py")
    ]
    assert problems == []


def _stray(path: Path) -> bool:
    """A module neither at the top (the command line and what it shares) nor in a layer."""
    where = path.relative_to(PACKAGE).parts
    if len(where) == 1:
        return path.stem not in {"__init__", "__main__", "cli", "doctor", "errors", "starter"}
    return where[0] not in LAYERS | {COMMANDS}


def test_every_module_outside_builder_sits_in_a_layer_or_at_the_top() -> None:
    assert [_module_name(p) for p in _package_modules() if _stray(p)] == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "fa_images.config.matrix",
            "from ..run import engine\n",
            ["fa_images.config.matrix imports fa_images.run", "fa_images.config.matrix imports fa_images.run.engine"],
        ),
        (
            "fa_images.outputs.exports.bake",
            "def f():\n    from ...run.executor import Executor\n",
            [
                "fa_images.outputs.exports.bake imports fa_images.run.executor",
                "fa_images.outputs.exports.bake imports fa_images.run.executor.Executor",
            ],
        ),
        (
            "fa_images.config.compat",
            "import fa_images.outputs.render\n",
            ["fa_images.config.compat imports fa_images.outputs.render"],
        ),
        ("fa_images.run.executor", "from ..outputs import context\nfrom ..config.matrix import Entry\n", []),
        ("fa_images.config.matrix", "from ..builder import contract\nfrom ..errors import Problem\n", []),
        ("fa_images.doctor", "from .run import engine\n", []),  # the top uses every layer
        ("fa_images.commands.pick", "from ..run.logger import say\n", []),
        (
            "fa_images.run.plan",
            "from ..commands import pick\n",
            ["fa_images.run.plan imports fa_images.commands", "fa_images.run.plan imports fa_images.commands.pick"],
        ),
    ],
)
def test_the_layer_check_sees_what_it_must(module: str, source: str, expected: list[str]) -> None:
    assert layer_violations(module, source) == expected


# The package must also hold together as a graph: no import circle between its modules, and no
# private name (one `_`, not a dunder) taken from another module. Every module counts here,
# builder/ included.


def _all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree``, lazy ones inside functions included, but none under ``if TYPE_CHECKING:``."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _from_target(module: str, node: ast.ImportFrom, *, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _bindings(module: str, tree: ast.AST, modules: set[str], *, is_package: bool) -> dict[str, str]:
    """Each name an import binds to an fa_images module: {local name: the module or package it names}."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                elif alias.name.split(".")[0] == "fa_images":  # `import fa_images.run.engine` binds `fa_images`
                    bound["fa_images"] = "fa_images"
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(module, node, is_package=is_package)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    return {name: what for name, what in bound.items() if what in modules or what == "fa_images"}


def import_edges(module: str, source: str, modules: set[str], *, is_package: bool = False) -> set[str]:
    """The fa_images modules ``module`` imports at run time (lazy imports too, TYPE_CHECKING ones not).

    An import names a module file: `from . import x` the module x where there is one, else the
    package (its ``__init__``); `from .x import y` the module x; `import a.b` the module a.b.
    """
    edges: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(module, node, is_package=is_package)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    edges.add(f"{target}.{alias.name}")
                elif target in modules:
                    edges.add(target)
    edges.discard(module)
    return edges


def import_graph(sources: dict[Path, str]) -> dict[str, set[str]]:
    """{module: the modules it imports} for files given as {path under fa_images/: source}."""
    modules = {_module_name(path) for path in sources}
    return {
        _module_name(path): import_edges(_module_name(path), source, modules, is_package=path.name == "__init__.py")
        for path, source in sources.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every simple cycle of ``graph``, once each, from its first module in name order: ``a -> b -> a``."""
    cycles: list[str] = []
    for start in sorted(graph):

        def walk(path: list[str], start: str = start) -> None:
            for nxt in sorted(graph.get(path[-1], set())):
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt > start and nxt not in path:
                    walk([*path, nxt])

        walk([start])
    return cycles


def private_imports(sources: dict[Path, str]) -> list[str]:
    """Each private name a module takes from another fa_images module: `from .x import _y`, or `x._y`
    where `x` is a name an import bound to an fa_images module (not `self.x._y`: that is an object's).
    Imports under `if TYPE_CHECKING:` count here: a private name is private to its module either way."""
    modules = {_module_name(path) for path in sources}
    found: set[str] = set()

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for path, source in sources.items():
        module, is_package = _module_name(path), path.name == "__init__.py"
        tree = ast.parse(source)
        bound = _bindings(module, tree, modules, is_package=is_package)
        for node in ast.walk(tree):  # one under `if TYPE_CHECKING:` too: a private name all the same
            if isinstance(node, ast.ImportFrom):
                target = _from_target(module, node, is_package=is_package)
                if target != module and (target == "fa_images" or target.startswith("fa_images.")):
                    found.update(f"{module} imports {target}.{a.name}" for a in node.names if private(a.name))
            elif isinstance(node, ast.Attribute) and private(node.attr):
                owner = _dotted(node.value, bound)
                if owner in modules and owner != module:
                    found.add(f"{module} uses {owner}.{node.attr}")
    return sorted(found)


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The module an expression like `engine` or `fa_images.run.engine` names, where an import bound it."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value, bound)
        return f"{owner}.{node.attr}" if owner else None
    return None


def _package_sources() -> dict[Path, str]:
    return {path: path.read_text() for path in _all_modules()}


def test_no_import_circle_between_modules() -> None:
    assert import_cycles(import_graph(_package_sources())) == []


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports(_package_sources()) == []


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        ({"a.py": "from . import b\n", "b.py": "from .a import X\n"}, ["fa_images.a -> fa_images.b -> fa_images.a"]),
        (
            {
                "run/x.py": "from . import y\n",
                "run/y.py": "def f():\n    from .z import Z\n",  # lazy, still a circle
                "run/z.py": "import fa_images.run.x\n",
            },
            ["fa_images.run.x -> fa_images.run.y -> fa_images.run.z -> fa_images.run.x"],
        ),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
                "b.py": "from .a import A\n",
            },
            [],
        ),
        (
            {
                "a.py": "import typing\nif typing.TYPE_CHECKING:\n    from . import b\nelse:\n    from . import c\n",
                "b.py": "from . import a\n",
                "c.py": "from .a import A\n",
            },
            ["fa_images.a -> fa_images.c -> fa_images.a"],
        ),
        (  # `from . import sharding` names the module, not the package that imports bake
            {"p/__init__.py": "from .bake import X\n", "p/bake.py": "from . import sharding\n", "p/sharding.py": ""},
            [],
        ),
        (  # a name that is no module names the package's __init__
            {"p/__init__.py": "from .bake import X\n", "p/bake.py": "from . import VERSION\n"},
            ["fa_images.p -> fa_images.p.bake -> fa_images.p"],
        ),
        ({"a.py": "from .b import x\n", "b.py": "import os\n"}, []),
    ],
)
def test_the_circle_check_sees_what_it_must(sources: dict[str, str], expected: list[str]) -> None:
    assert import_cycles(import_graph({PACKAGE / k: v for k, v in sources.items()})) == expected


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (
            {"run/engine.py": "", "run/sdk.py": "from .engine import _short, short\n"},
            ["fa_images.run.sdk imports fa_images.run.engine._short"],
        ),
        (
            {"run/engine.py": "", "outputs/x.py": "def f():\n    from fa_images.run.engine import _call\n"},
            ["fa_images.outputs.x imports fa_images.run.engine._call"],
        ),
        (
            {"run/engine.py": "", "run/sdk.py": "from . import engine\nengine._short(1)\n"},
            ["fa_images.run.sdk uses fa_images.run.engine._short"],
        ),
        (
            {"run/engine.py": "", "run/sdk.py": "import fa_images.run.engine\nfa_images.run.engine._x()\n"},
            ["fa_images.run.sdk uses fa_images.run.engine._x"],
        ),
        (
            {
                "run/engine.py": "",
                "run/sdk.py": "from .engine import __version__\nfrom . import engine\nengine.__doc__\n",
            },
            [],
        ),
        ({"run/engine.py": "", "run/sdk.py": "class S:\n    def f(self):\n        self.engine._container()\n"}, []),
        ({"run/sdk.py": "from os import _exit\nimport os\nos._exit(0)\n"}, []),  # not fa_images
        (
            {
                "run/engine.py": "",
                "run/sdk.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .engine import _Call\n",
            },
            ["fa_images.run.sdk imports fa_images.run.engine._Call"],
        ),
    ],
)
def test_the_private_check_sees_what_it_must(sources: dict[str, str], expected: list[str]) -> None:
    assert private_imports({PACKAGE / k: v for k, v in sources.items()}) == expected
