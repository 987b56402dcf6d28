"""labkit.grading.protocol: a reply is read whole, within its deadline, and nothing else the protocol does not allow."""
import io
import os
import time

import pytest
import torch

from labkit.grading import protocol
from labkit.grading.seal import frame


def pipe_with(data: bytes) -> int:
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def test_a_reply_is_read_whole_and_anything_else_is_refused():
    reply = {"round": 3, "obs": {"losses": [1.0, 0.5], "logits": torch.ones(2, 3)}}
    got = protocol.read_reply(pipe_with(protocol.encode_reply(reply)), time.monotonic() + 5)
    assert got["round"] == 3 and torch.equal(got["obs"]["logits"], torch.ones(2, 3))
    with pytest.raises(ValueError, match="at most"):  # a length no reply may have: refused before reading it
        protocol.read_reply(pipe_with((protocol.MAX_REPLY_BYTES + 1).to_bytes(8, "little")), time.monotonic() + 5)
    with pytest.raises(ValueError, match="could not be read"):
        protocol.read_reply(pipe_with(frame(b"\xff" * 64)), time.monotonic() + 5)
    buf = io.BytesIO()
    torch.save(["not", "a", "reply"], buf)
    with pytest.raises(ValueError, match="not one"):
        protocol.read_reply(pipe_with(frame(buf.getvalue())), time.monotonic() + 5)
    with pytest.raises(EOFError):  # the process died mid-reply
        protocol.read_reply(pipe_with(protocol.encode_reply(reply)[:20]), time.monotonic() + 5)
    r, w = os.pipe()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):  # a process that never replies
        protocol.read_reply(r, time.monotonic() + 0.3)
    assert 0.25 < time.monotonic() - t0 < 5
    os.close(w)
