"""Record a notebook's measured figures so batch runs collect them as data.

`record("h2d_pinned_gbps", 55.1, "GB/s")` prints one line and puts the figure in the cell's
output under the MIME type below; `labkit run` reads it back from the executed notebook.
"""
from __future__ import annotations

import math
from typing import Any

MIME = "application/vnd.labkit.figure+json"

figures: dict[str, dict[str, Any]] = {}


def record(name: str, value: float | int | str | bool, unit: str = "", note: str = "") -> Any:
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
    text = f"{name} = {_fmt(value)} {unit}".rstrip() + (f"  ({note})" if note else "")
    try:
        from IPython import get_ipython
        from IPython.display import display
        if get_ipython() is not None:
            display({"text/plain": text, MIME: entry}, raw=True)
            return value
    except ImportError:
        pass
    print(text)
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def figures_in(notebook: dict) -> dict[str, dict[str, Any]]:
    """The figures recorded in an executed notebook (a dict as nbformat reads it)."""
    found: dict[str, dict[str, Any]] = {}
    for cell in notebook.get("cells", []):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            entry = out.get("data", {}).get(MIME)
            if isinstance(entry, dict) and "name" in entry:
                found[entry["name"]] = entry
    return found
