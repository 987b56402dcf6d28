"""The rounds' protocol (labkit.grading.rounds): requests are JSON frames (labkit.grading.seal.frame), replies
torch.save frames read with weights_only, and a served workload's call is a frame header of its own (ASK_FRAME)."""
from __future__ import annotations

import io
import os
import select
import time
from typing import Callable

from labkit.grading.seal import frame

MAX_REPLY_BYTES = 64 * 2**20
# A served workload's call (labkit.exercises.spec.Served): a frame header no reply can have, with no body, so the
# parent reads it in one system call and no decoding, and the call's round trip through the pipes stays short
ASK_FRAME = (2**64 - 1).to_bytes(8, "little")


def encode_reply(reply: dict, save: Callable = None) -> bytes:
    import torch

    buf = io.BytesIO()
    (save or torch.save)(reply, buf)
    return frame(buf.getvalue())


def write_all(fd: int, data: bytes, write: Callable = os.write) -> None:
    view = memoryview(data)
    while view:
        view = view[write(fd, view):]


def serve(read_request: Callable[[], dict], handle: Callable[[dict], dict], reply: Callable[[dict], None]) -> None:
    """Answer requests until {"end": true}: each {"round": i, "kind": k, ...} gets handle(request) as its reply
    (with the same "round" and "kind"). Kinds: "round" (run round i on "args", timed), "check" (untimed: is what
    judges intact?), "after" (untimed, once the rounds are over)."""
    while True:
        req = read_request()
        if req.get("end"):
            return
        t0 = time.perf_counter()
        out = handle(req)
        # served_s: the server's own figure, never used for a grade (the parent's clock is): what the round trip adds
        reply({**out, "round": req["round"], "kind": req["kind"], "served_s": time.perf_counter() - t0})


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def read_reply(fd: int, deadline: float) -> dict:
    """One reply frame from `fd` before `deadline` (time.monotonic): TimeoutError, EOFError (the process is gone),
    ValueError (not a reply the protocol allows)."""
    import torch

    head = _read_exactly(fd, 8, deadline)
    if head == ASK_FRAME:
        return {"round": -1, "kind": "ask"}
    size = int.from_bytes(head, "little")
    if size > MAX_REPLY_BYTES:
        raise ValueError(f"a reply of {size} bytes (at most {MAX_REPLY_BYTES // 2**20} MB)")
    try:
        reply = torch.load(io.BytesIO(_read_exactly(fd, size, deadline)), weights_only=True, map_location="cpu")
    except (TimeoutError, EOFError):
        raise
    except Exception as exc:
        raise ValueError(f"a reply that could not be read ({type(exc).__name__})") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("round"), int):
        raise ValueError("a reply that is not one")
    return reply
