"""HTML helpers shared by the report sections."""
from __future__ import annotations


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table; cells and headers are HTML fragments, numbers right-aligned."""
    th = "".join(f"<th>{h}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td class='num'>{c}</td>" if _is_number(c) else f"<td>{c}</td>" for c in r) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"
