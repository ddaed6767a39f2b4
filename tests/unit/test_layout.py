"""The package's layers (docs/architecture.md): config, then outputs, then run; each imports only those before it.

So the matrix can be loaded and checked without the code that writes files, and the files can
be written without the code that talks to an engine. builder/ has its own, stricter test
(test_builder_isolation.py).
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
        and name.split(".")[1] in LAYERS
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
    return where[0] not in LAYERS


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
    ],
)
def test_the_layer_check_sees_what_it_must(module: str, source: str, expected: list[str]) -> None:
    assert layer_violations(module, source) == expected
