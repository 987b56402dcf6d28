"""Every relative link in every notebook and markdown file of the course points at a file that exists."""
import re
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", "build", ".git", ".ipynb_checkpoints", "node_modules", ".whl", ".gpu"}
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:href|src)=[\"']([^\"']+)[\"']")


def documents() -> list[Path]:
    found = [p for ext in ("*.ipynb", "*.md") for p in ROOT.rglob(ext)]
    return sorted(p for p in found if not SKIP_DIRS & set(p.relative_to(ROOT).parts))


def markdown_of(path: Path) -> str:
    if path.suffix == ".md":
        return path.read_text()
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def relative_links(path: Path) -> list[str]:
    """Targets of [text](target), href= and src= that are paths inside the repository."""
    text = re.sub(r"```.*?```", "", markdown_of(path), flags=re.S)  # code blocks hold no links
    targets = [a or b for a, b in LINK.findall(text)]
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", t, flags=re.I)]


def resolve(path: Path, target: str) -> Path:
    return (path.parent / unquote(target.split("#")[0].split("?")[0])).resolve()


def course_links(start: Path = ROOT / "notebooks" / "index.ipynb") -> set[Path]:
    """The index, the notebooks it links, and every file those link (exercises, other notebooks)."""
    seen, todo = set(), [start.resolve()]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        if path.suffix in (".ipynb", ".md"):
            todo += [resolve(path, t) for t in relative_links(path)]
    return seen


def test_the_course_has_documents_with_links():
    docs = documents()
    assert ROOT / "notebooks" / "index.ipynb" in docs and ROOT / "README.md" in docs
    assert sum(len(relative_links(d)) for d in docs) > 20


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = [t for t in relative_links(doc) if not resolve(doc, t).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"
    outside = [t for t in relative_links(doc) if not resolve(doc, t).is_relative_to(ROOT)]
    assert not outside, f"{doc.relative_to(ROOT)} links outside the repository: {outside}"


def test_the_index_reaches_every_notebook_and_exercise():
    reached = course_links()
    wanted = {*(ROOT / "notebooks").glob("[0-9]*.ipynb"), *(ROOT / "exercises").glob("*.ipynb")}
    assert not wanted - reached, f"not reachable from the index: {sorted(p.name for p in wanted - reached)}"
