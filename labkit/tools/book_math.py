"""A Sphinx extension for `labkit book`: the notebooks' LaTeX math as MathML, converted at build time.

MathML is drawn by the browser itself (Chromium, Firefox, Safari), so a page needs no MathJax and fetches nothing.
"""
from __future__ import annotations

import html
from typing import Any

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.util import logging

log = logging.getLogger(__name__)


def mathml(latex: str, display: str) -> str:
    """MathML for `latex` ('inline' or 'block'); the LaTeX as code where it cannot be converted (with a warning)."""
    try:
        return convert(latex, display=display)
    except Exception as exc:  # latex2mathml raises several kinds for macros it lacks
        log.warning(f"labkit book: could not convert math {latex!r} to MathML ({exc}); shown as LaTeX")
        return f"<code>{html.escape(latex)}</code>"


def _inline(self: Any, node: nodes.Element) -> None:
    self.body.append(mathml(node.astext(), "inline"))
    raise nodes.SkipNode


def _block(self: Any, node: nodes.Element) -> None:
    self.body.append(f'<div class="math-display">{mathml(node.astext(), "block")}</div>')
    raise nodes.SkipNode


def setup(app: Any) -> dict[str, Any]:
    app.add_html_math_renderer("mathml", (_inline, None), (_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
