"""Markdown tables: the one writer behind the sweep summary and the reports of scripts/."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A Markdown table (no trailing newline). `align` has one letter per column, `l` or `r`; by
    default the first column is left-aligned and the others, usually figures, right-aligned. A `|`
    inside a cell is escaped so that it stays in its column."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align={align!r} needs one of l or r for each of {len(header)} columns")
    body = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    for row in body:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(header)} columns: {row}")
    lines = [header, ["---:" if a == "r" else "---" for a in align], *body]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)
