"""Outcomes of work graded before, stored by what was graded: identical code under the same grader and machine gets
the outcome it got the first time, so the same work gets the same points however often, and by however many
graders at once, it is graded.

A key is the sha256 of the grader's fingerprint (labkit's and the graded tests' source, the seed, the device and its
name, the limits) and one notebook's code cells and graded functions. A notebook whose functions all ran to a
verdict (no crash, no time-out, nothing cut short, no failure of the grader's own such as its baseline's process
failing) stores their outcomes in one JSON file per key; graders that share a store hold a lock per key while they
grade it, so concurrent graders measure identical work once.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Iterator

from labkit.grading import safeio
from labkit.grading.judge import Outcome

ENV = "LABKIT_GRADE_MEMO"  # a folder, or "off"
MAX_BYTES = 1 << 20


def default_folder() -> Path | None:
    """$LABKIT_GRADE_MEMO ("off": no store), else the user's cache (~/.cache/labkit/grades)."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "labkit" / "grades"


def fingerprint(sources: Iterable[Path], **settings: object) -> str:
    """A digest of every file under `sources` (folders walked in sorted order, .py files) and the settings."""
    h = hashlib.sha256()
    for root in sources:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in files:
            if "__pycache__" in path.parts:
                continue
            h.update(str(path.relative_to(root) if root.is_dir() else path.name).encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


class Memo:
    """A store of outcomes in `folder` under one grader fingerprint; `remeasure` grades again and replaces them."""

    def __init__(self, folder: Path, grader: str, remeasure: bool = False):
        self.folder, self.grader, self.remeasure = folder, grader, remeasure
        folder.mkdir(parents=True, exist_ok=True)

    def key(self, job: dict) -> str:
        """The key of one notebook's job: its code cells and graded functions, under this grader."""
        body = json.dumps({"grader": self.grader, "notebook": job["name"], "cells": job["cells"],
                           "functions": job["functions"]}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    @contextlib.contextmanager
    def locked(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold each key's lock (in sorted order: two graders never wait on each other in a circle)."""
        with contextlib.ExitStack() as stack:
            for key in sorted(set(keys)):
                f = stack.enter_context(open(self.folder / f"{key}.lock", "a"))
                fcntl.flock(f, fcntl.LOCK_EX)
                stack.callback(fcntl.flock, f, fcntl.LOCK_UN)
            yield

    def get(self, key: str, functions: list[str]) -> tuple[dict[str, Outcome], list[str]] | None:
        """(the stored outcomes of exactly these functions, the notes their run left), or None (none stored,
        unreadable, or --remeasure)."""
        if self.remeasure:
            return None
        try:  # a regular file of bounded size, no link followed (safeio), else measured again
            stored = json.loads(safeio.read_bytes(self.folder / f"{key}.json", MAX_BYTES))
            outcomes = {fn: Outcome(**stored["outcomes"][fn]) for fn in functions}
            notes = [str(n) for n in stored["notes"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return (outcomes, notes) if set(stored["outcomes"]) == set(functions) else None

    def put(self, key: str, outcomes: dict[str, Outcome], notes: list[str]) -> None:
        """Store these outcomes and notes (written to a temporary file, then renamed into place)."""
        try:
            text = json.dumps({"outcomes": {fn: asdict(o) for fn, o in outcomes.items()}, "notes": notes})
        except (TypeError, ValueError):  # details that JSON cannot hold: measured again next time
            return
        tmp = self.folder / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        safeio.write_new(tmp, text)
        safeio.publish(tmp, self.folder / f"{key}.json")
