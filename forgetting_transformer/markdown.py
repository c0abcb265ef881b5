"""Markdown tables: the one builder behind every table the evaluations, scripts and benchmarks print or write.

``table`` builds a whole table; ``header`` and ``row`` give its lines one at a time, for a table printed as its
rows are measured."""

from __future__ import annotations

SEPARATORS = {"l": "---", "r": "---:", "c": ":---:"}


def header(headers: list[str], align: str | None = None) -> str:
    """The header line and the separator line. ``align`` has a letter per column, ``l`` (left), ``r`` (right) or
    ``c`` (centre); by default the first column is left-aligned and the others right-aligned (a label, then
    numbers)."""
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers) or set(align) - set(SEPARATORS):
        raise ValueError(f"align must have one of l, r, c per column ({len(headers)}); got {align!r}")
    return row(headers) + "\n|" + "|".join(SEPARATORS[a] for a in align) + "|"


def row(cells: list) -> str:
    """One row, its cells made strings."""
    return "| " + " | ".join(map(str, cells)) + " |"


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A whole table: ``header`` and a line per row; a row with another number of cells is an error."""
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"a row has {len(r)} cells for {len(headers)} columns: {r!r}")
    return "\n".join([header(headers, align), *map(row, rows)])
