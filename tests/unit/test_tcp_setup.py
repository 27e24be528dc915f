"""Set-up of TCP connections (Note [TCP frames] in csrc/transport/tcp.h), with
two engines in one process: strangers on the listening port are refused without
breaking set-up, a wrong job token fails it with a clear error, and frame
headers are validated before use."""

import os
import socket
import struct
import threading
import time

import pytest
import torch.distributed  # noqa: F401  (the extension needs it loaded first)

from tilecomm import _C

HELLO = struct.Struct("<IIiiiI32s")  # magic, world, from, to, lane, slot_bytes, token
HELLO_MAGIC = 0x74636830
SLOT_BYTES = 4096
TOKEN = bytes(range(32))


def _engine(rank):
    return _C.Engine(rank, 2, slots=2, slot_bytes=SLOT_BYTES, tcp_slots=4, tcp_frame_bytes=SLOT_BYTES, spin_ns=0,
                     yields=4, sleep_us=1000, timeout_ms=5000)


def _connect_both(engines, ports, tokens, timeout_ms):
    errors = [None, None]

    def run(r):
        try:
            engines[r].connect([0, 2] if r == 0 else [2, 0], [e.segment_name() for e in engines],
                               [os.getpid()] * 2, ["127.0.0.1"] * 2, ports, tokens[r], timeout_ms)
        except Exception as e:  # noqa: BLE001  (reported to the test)
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "connect did not return"
    return errors


def test_strangers_are_refused_and_set_up_completes():
    engines = [_engine(0), _engine(1)]
    ports = [e.listen("127.0.0.1") for e in engines]
    strangers = []
    for payload in (b"GET / HTTP/1.0\r\n\r\n" + bytes(HELLO.size),  # garbage
                    HELLO.pack(HELLO_MAGIC, 2, 1, 0, 0, SLOT_BYTES, b"x" * 32),  # wrong token
                    HELLO.pack(HELLO_MAGIC, 2, 5, 0, 0, SLOT_BYTES, TOKEN),  # right token, no such rank
                    b"\x00\x01"):  # too short, then closed
        s = socket.create_connection(("127.0.0.1", ports[0]))
        s.sendall(payload)
        strangers.append(s)
    closer = threading.Timer(0.5, lambda: [s.close() for s in strangers])
    closer.start()
    t0 = time.monotonic()
    errors = _connect_both(engines, ports, [TOKEN, TOKEN], 20000)
    closer.join()
    assert errors == [None, None], errors
    assert time.monotonic() - t0 < 10
    # Nothing listens any more once every connection is up.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ports[0]), timeout=2).close()


def test_wrong_token_fails_set_up_on_both_sides():
    engines = [_engine(0), _engine(1)]
    ports = [e.listen("127.0.0.1") for e in engines]
    errors = _connect_both(engines, ports, [TOKEN, b"y" * 32], 2000)
    assert errors[1] is not None and "rank 0" in str(errors[1]), errors
    assert errors[0] is not None and "token" in str(errors[0]), errors


def test_interface_address():
    assert _C.interface_address("lo") == "127.0.0.1"
    with pytest.raises(ValueError, match="no-such-if0"):
        _C.interface_address("no-such-if0")


FRAME = struct.Struct("<IBBHIIQ32sQQI4xqQ")  # FrameHeader: magic kind lane _ len _ seq | SlotHeader
FRAME_MAGIC = 0x74636632


def _frame(kind=1, lane=0, length=8, seq=0, msg=8, off=0, slot_len=None, magic=FRAME_MAGIC):
    raw = FRAME.pack(magic, kind, lane, 0, length, 0, seq, bytes(32), msg, off,
                     length if slot_len is None else slot_len, 0, 0)
    return raw + bytes(_C.FRAME_HEADER_BYTES - len(raw))


@pytest.mark.parametrize(
    "frame,why",
    [
        (_frame(), ""),
        (_frame(kind=2, length=100), ""),
        (_frame(magic=1), "magic"),
        (_frame(kind=7), "kind"),
        (_frame(lane=1), "lane"),
        (_frame(seq=3), "#3"),
        (_frame(length=SLOT_BYTES + 1, msg=1 << 20, slot_len=SLOT_BYTES + 1), "slot size"),
        (_frame(slot_len=7), "slot header"),
        (_frame(msg=8, off=4), "outside"),
        (_frame(kind=2, length=5000), "abort frame"),
        (_frame(kind=3, length=7), "board frame"),
        (_frame(kind=2, lane=1, length=8), "point-to-point lane"),
    ],
)
def test_frame_headers_are_checked(frame, why):
    lane = 1 if "point-to-point" in why else 0
    got = _C.check_frame(frame, lane, 0, SLOT_BYTES)
    assert (got == "") if not why else (why in got), got
