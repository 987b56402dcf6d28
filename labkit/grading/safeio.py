"""The parent's file hygiene: never follow a link or open a FIFO or device it was handed; read with caps.

Submissions and everything a grading process wrote are untrusted: files are opened with O_NOFOLLOW
and O_NONBLOCK, checked to be regular files with fstat, and read up to a size cap. Reports are
written into a folder the grader made itself (mkdtemp) and renamed into place.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

MAX_NOTEBOOK_BYTES = 128 * 2**20  # a notebook with large cell outputs: read, its outputs dropped (submissions.py)
MAX_DEPTH = 32  # folder levels looked at below a submission or a results folder
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A path that is not a regular file of acceptable size (a link, a FIFO, a device, too large)."""


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path, max_bytes: int) -> int:
    """A read-only fd on `path` if it is a regular file (no link followed, no FIFO opened) of at most max_bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a link
            raise UnsafeFile(f"{path.name} is a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(f"{path.name} is {kind(st.st_mode)}")
    if st.st_size > max_bytes:
        os.close(fd)
        raise UnsafeFile(f"{path.name} is larger than {max_bytes // 2**20} MB")
    return fd


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The content of a regular file, refusing links, special files and files over max_bytes."""
    fd = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{path.name} grew past {max_bytes // 2**20} MB while being read")
    return data


def tail(path: Path, nbytes: int = 4000) -> str:
    """The last nbytes of a regular file (a log), without reading the rest."""
    try:
        fd = open_regular(path, 2**62)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - nbytes))
        return f.read(nbytes).decode("utf-8", "replace")


class EventReader:
    """Reads a JSON-lines file as it grows: only the new bytes each time, at most `cap` bytes in all."""

    def __init__(self, path: Path, cap: int = 4 * 2**20, max_line: int = 16384):
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise UnsafeFile(f"{path} is not a regular file")
        self.cap, self.max_line, self.read_so_far = cap, max_line, 0
        self.events: list[dict] = []
        self.flooded = False
        self._partial = b""

    def poll(self, chunk: int = 1 << 18) -> list[dict]:
        """The events completed since the last poll (reads at most `chunk` bytes)."""
        if self.flooded:
            return []
        data = os.read(self.fd, min(chunk, self.cap - self.read_so_far + 1))
        self.read_so_far += len(data)
        if self.read_so_far > self.cap:
            self.flooded = True
            return []
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.max_line:
            self._partial = b""  # an overlong line is dropped, not buffered
        new = []
        for line in lines:
            if len(line) > self.max_line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                new.append(ev)
        self.events += new
        return new

    def drain(self) -> list[dict]:
        """Everything left to read (up to the cap)."""
        while not self.flooded:
            before = self.read_so_far
            self.poll()
            if self.read_so_far == before:
                break
        return self.events

    def close(self) -> None:
        os.close(self.fd)


def walk(top: Path, max_depth: int = MAX_DEPTH, limit: int = 10000):
    """Yield (folder, [subfolder names], [other entry names]) under `top`, top first, sorted: iterative (no
    recursion, however deep the tree), no link followed, at most `max_depth` levels and `limit` entries.
    The generator's return value (StopIteration.value) says what was cut: "" if nothing."""
    stack, seen, cut = [(str(top), 0)], 0, ""
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs, other = [], []
        for e in entries:
            seen += 1
            if seen > limit:
                return f"more than {limit} entries"
            try:
                (dirs if e.is_dir(follow_symlinks=False) else other).append(e.name)
            except OSError:
                other.append(e.name)
        yield folder, dirs, other
        if depth + 1 >= max_depth and dirs:
            cut = cut or f"folders more than {max_depth} levels deep"
            continue
        stack += [(os.path.join(folder, d), depth + 1) for d in reversed(dirs)]
    return cut


def tree_bytes(folder: Path, limit: int = 10000) -> int:
    """Bytes in the regular files under `folder` (links not followed), over at most `limit` entries; 2**62
    (over any limit) for a tree with more entries or levels than that."""
    total, gen = 0, walk(folder, max_depth=limit, limit=limit)
    while True:
        try:
            root, _, files = next(gen)
        except StopIteration as stop:
            return 2**62 if stop.value else total
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0


def rmtree(path: Path) -> None:
    """Remove `path` and everything below it: iterative and fd-relative (no recursion, no path-length limit,
    no link followed, unreadable folders made readable first); errors are ignored, as the grader's cleanup."""
    try:
        fd = os.open(path, _DIR)
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    names: list[str] = []  # the folders below `path` that fd is in
    stuck: set[tuple[str, ...]] = set()  # folders that could not be entered: left as they are
    while True:
        child = None
        try:
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        if not e.is_dir(follow_symlinks=False):
                            os.unlink(e.name, dir_fd=fd)
                        elif (*names, e.name) not in stuck:
                            child = e.name
                            break
                    except OSError:
                        pass
        except OSError:
            pass
        if child is not None:
            try:
                try:
                    new = os.open(child, _DIR, dir_fd=fd)
                except PermissionError:
                    os.chmod(child, 0o700, dir_fd=fd)
                    new = os.open(child, _DIR, dir_fd=fd)
            except OSError:
                stuck.add((*names, child))
                continue
            os.close(fd)
            fd = new
            names.append(child)
            continue
        if not names:
            os.close(fd)
            break
        try:
            up = os.open("..", _DIR, dir_fd=fd)
        except OSError:
            os.close(fd)
            return
        os.close(fd)
        fd = up
        gone = names.pop()
        try:
            os.rmdir(gone, dir_fd=fd)
        except OSError:
            stuck.add((*names, gone))
    try:
        os.rmdir(path)
    except OSError:
        pass


def real_dir(path: Path, what: str) -> Path:
    """`path` made absolute (links resolved); refuses a path whose last component is a link or not a folder."""
    path = Path(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path.resolve()
    if stat.S_ISLNK(st.st_mode):
        return real_dir(path.resolve(), what)  # an instructor's own link (e.g. ~/grades -> /data): resolved once
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(f"{what} {path} is {kind(st.st_mode)}, not a folder")
    return path.resolve()


def staging_dir(out: Path) -> Path:
    """A fresh folder the grader made itself (mode 0700) inside `out`, for files to rename into place."""
    out.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".labkit-staging-", dir=out))


def write_new(path: Path, text: str) -> None:
    """Create `path` (never an existing file, link or FIFO) and write `text`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def publish(staged: Path, dest: Path) -> None:
    """Move `staged` (made by the grader) to `dest`, replacing whatever is there without following links."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and staged.is_dir():
        old = Path(tempfile.mkdtemp(prefix=".labkit-old-", dir=dest.parent))
        os.rename(dest, old / "x")  # a real folder: moved aside, then removed (rmtree follows no links)
        os.rename(staged, dest)
        rmtree(old)
        return
    if st is not None and (stat.S_ISDIR(st.st_mode) or staged.is_dir()):
        remove(dest)
    os.rename(staged, dest)  # over a file, link or FIFO: rename replaces the entry itself


def remove(path: Path) -> None:
    """Remove a file, link, FIFO or folder without following links."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        rmtree(path)
    else:
        os.unlink(path)
