"""Each flash-attn generation on the host side, one module each (fa2, fa3, fa4): its matrix section,
how a combination becomes its entry, and the recipe that entry carries (recipe.py).

A new generation is a module here with GENERATION, SECTION and resolve(), its Generation in
builder/generations/, and its install fragment in templates/install/ where it installs otherwise
than from its wheel (docs/architecture.md, "Adding a generation").
"""

from __future__ import annotations

from types import ModuleType

from ...builder.generations import Generation
from . import fa2, fa3, fa4
from .recipe import InstallStage, Recipe, Section, Versions, Work

MODULES: tuple[ModuleType, ...] = (fa2, fa3, fa4)


def module_of(generation: Generation) -> ModuleType:
    """The host module of a generation the builder's registry names."""
    return next(m for m in MODULES if m.GENERATION is generation)


def sections() -> tuple[Section, ...]:
    """Every generation's own section of matrix.yaml, in generation order."""
    return tuple(m.SECTION for m in MODULES if m.SECTION is not None)


__all__ = ["MODULES", "InstallStage", "Recipe", "Section", "Versions", "Work", "module_of", "sections"]
