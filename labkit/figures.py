"""Record a notebook's measured figures so batch runs collect them as data.

`record("h2d_pinned_gbps", 55.1, "GB/s")` prints one line and puts the figure in the cell's
output under the MIME type below; `labkit run` reads it back from the executed notebook.
"""
from __future__ import annotations

import math
from typing import Any

MIME = "application/vnd.labkit.figure+json"

figures: dict[str, dict[str, Any]] = {}


def display_entry(text: str, mime: str, entry: dict[str, Any]) -> None:
    """Show `text` and attach `entry` as data under `mime` (plain print outside IPython)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
        if get_ipython() is not None:
            display({"text/plain": text, mime: entry}, raw=True)
            return
    except ImportError:
        pass
    print(text)


def record(name: str, value: float | int | str | bool, unit: str = "", note: str = "") -> None:
    """Keep one measured figure (a number, or a short string) and show it."""
    if not isinstance(name, str) or not name:
        raise ValueError("record() needs a non-empty figure name")
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        value = value.item()
    if not isinstance(value, (int, float, str, bool)):
        raise TypeError(f"record({name!r}, ...) takes a number or a string, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        value = str(value)  # JSON has no NaN/inf
    entry = {"name": name, "value": value, "unit": unit, "note": note}
    figures[name] = entry
    text = f"{name} = {fmt_value(value)} {unit}".rstrip() + (f"  ({note})" if note else "")
    display_entry(text, MIME, entry)


def fmt_value(value: Any) -> str:
    """A figure as people read it: 4 significant digits, thousands separated, never '0.00'."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    if abs(value) >= 1e3:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def entries_in(notebook: dict, mime: str = MIME) -> dict[str, dict[str, Any]]:
    """The named entries an executed notebook (a dict as nbformat reads it) holds under `mime`, by name."""
    found: dict[str, dict[str, Any]] = {}
    for cell in notebook.get("cells", []):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            entry = out.get("data", {}).get(mime)
            if isinstance(entry, dict) and "name" in entry:
                found[entry["name"]] = entry
    return found


def figures_in(notebook: dict) -> dict[str, dict[str, Any]]:
    """The figures recorded in an executed notebook."""
    return entries_in(notebook, MIME)
