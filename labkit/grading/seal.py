"""Results sealed with a key the parent hands each run on stdin, read before any student code runs.

The child writes `<function>.pt` and reports its HMAC in the `fn_done` event; the parent accepts a
results file only with a matching seal. A file the student's code wrote or changed is refused,
unless that code digs the key out of the harness's memory (see README: what the sandbox does not do).
"""
from __future__ import annotations

import hashlib
import hmac
import io
import os


def new_key() -> str:
    return os.urandom(16).hex()


def read_key() -> bytes:
    """The key on stdin (up to its end), then stdin becomes /dev/null."""
    data = b""
    while len(data) < 256:
        chunk = os.read(0, 256)
        if not chunk:
            break
        data += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return data.strip()


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
