"""What the result tables share (LM-eval-harness Table 1, LongBench Table 2, scripts/make_tables.py Table 3): the
paper's best / second-best marks and LaTeX escaping."""

from __future__ import annotations


def rank_marks(values: list[float | None], lower: bool) -> list[int]:
    """Per value: 1 = best, 2 = second best (ties share a rank), 0 = otherwise / missing."""
    distinct = sorted({v for v in values if v is not None}, reverse=not lower)
    ranks = {v: i + 1 for i, v in enumerate(distinct[:2])}
    return [ranks.get(v, 0) if v is not None else 0 for v in values]


def mark(cell: str, rank: int, latex: bool) -> str:
    """``cell`` in bold (rank 1) or underlined (rank 2), as Markdown or LaTeX; unchanged otherwise."""
    if rank == 1:
        return rf"\textbf{{{cell}}}" if latex else f"**{cell}**"
    if rank == 2:
        return rf"\underline{{{cell}}}" if latex else f"<u>{cell}</u>"
    return cell


def tex_escape(s: str) -> str:
    """Plain text (model names, dataset labels) for a LaTeX table cell."""
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
        s = s.replace(a, b)
    return s
