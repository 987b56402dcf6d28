"""Results sealed with a key the parent hands each run on stdin, read before any student code runs; a
shard's outputs sealed with a key made from the hidden tests (graded_key), checked by `labkit grade merge`.

The child writes `<function>.pt` and reports its HMAC in the `fn_done` event; the parent accepts a
results file only with a matching seal. A file the student's code wrote or changed is refused,
unless that code digs the key out of the harness's memory (see README: what the sandbox does not do).
"""
from __future__ import annotations

import hashlib
import hmac
import io
import os
from pathlib import Path


def new_key() -> str:
    return os.urandom(16).hex()


def read_key(keep: bool = False) -> bytes | tuple[bytes, int]:
    """The key on stdin (its first line), then stdin becomes /dev/null. `keep`: (key, an fd on the rest of
    the parent's pipe, where it sends the hidden cases later: read_frame)."""
    data = b""
    while len(data) < 256 and not data.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            break
        data += chunk
    rest = os.dup(0) if keep else None
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return (data.strip(), rest) if keep else data.strip()


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(8, "little") + payload


def read_frame(fd: int, read=os.read) -> bytes:
    """One frame (8-byte length, then the bytes) from `fd`; EOFError if the pipe ends first."""
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("the grader's pipe closed")
            buf += chunk
        return buf
    return exactly(int.from_bytes(exactly(8), "little"))


def graded_key(graded: Path, seed: int) -> bytes:
    """A key only the holder of the hidden tests can make: a hash of every file in the graded folder, and the
    seed. It seals a shard's outputs (`labkit grade --shard`), so `labkit grade merge` can tell edited ones."""
    h = hashlib.sha256(f"labkit-shard-seal\0{seed}\0".encode())
    for path in sorted(p for p in graded.iterdir() if p.is_file() and not p.name.startswith(".")):
        h.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.digest()


def seal_files(key: bytes, files: dict[str, str]) -> str:
    """The seal of a set of output files (relative name -> text)."""
    body = b"".join(name.encode() + b"\0" + hashlib.sha256(text.encode()).digest()
                    for name, text in sorted(files.items()))
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def check_files(key: bytes, files: dict[str, str], mac: object) -> bool:
    return isinstance(mac, str) and hmac.compare_digest(seal_files(key, files), mac)


def seal(key: bytes, name: str, payload: bytes) -> str:
    return hmac.new(key, name.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def check(key: bytes, name: str, payload: bytes, mac: object) -> bool:
    return isinstance(mac, str) and hmac.compare_digest(seal(key, name, payload), mac)


def write(key: bytes, folder: str, name: str, obj: object, save, replace) -> str:
    """torch.save `obj` to folder/name.pt (through a temporary file); its seal."""
    buf = io.BytesIO()
    save(obj, buf)
    payload = buf.getvalue()
    tmp = os.path.join(folder, f".{name}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    replace(tmp, os.path.join(folder, f"{name}.pt"))
    return seal(key, name, payload)
