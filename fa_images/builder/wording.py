"""How a count reads in a message: "1 entry", "2 entries", never "1 entries"."""

from __future__ import annotations

# Nouns whose plural is not the singular plus "s".
_IRREGULAR = {"entry": "entries"}


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """'1 wheel', '3 wheels', '2 entries'."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {plural or _IRREGULAR.get(noun, noun + 's')}"
