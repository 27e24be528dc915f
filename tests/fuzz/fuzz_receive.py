"""Fuzzes the code that reads what peers send: TCP frame streams and shared-memory slots.

    python tests/fuzz/fuzz_receive.py tcp -runs=200000      # atheris (libFuzzer flags after the target)
    python tests/fuzz/fuzz_receive.py slot -max_total_time=600

Inputs are built from the fuzzer's bytes around valid frames and slot headers
(each field either right or taken from the data), so that mutations reach the
checks behind the first one. A target fails only if the receiver crashes, or
accepts something it should have refused (``check``); refusing with an error is
the expected outcome for most inputs. tests/unit/test_fuzz.py runs the same
targets on random inputs in CI.
"""

from __future__ import annotations

import random
import struct
import sys

import torch.distributed  # noqa: F401  (the extension needs it loaded first)

from tilecomm import _C

SLOT_BYTES = 256
FRAME_MAGIC = 0x74636632
DESC = struct.Struct("<QQiHBBB7x")  # CollDesc (32 bytes): seq count root algo coll dtype op, padding
SLOT = struct.Struct("<32sQQI4xqQ")  # SlotHeader: desc msg_bytes offset len (padding) tag p2p_seq
FRAME = struct.Struct("<IBBHII Q")  # FrameHeader up to the slot header
assert DESC.size == 32 and SLOT.size == _C.SLOT_HEADER_BYTES
assert FRAME.size + SLOT.size + DESC.size == _C.FRAME_HEADER_BYTES  # ... then the call before (a CollDesc)


class Source:
    """Draws choices from a byte string (a fuzzer's input), then zeros once it is used up."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out + bytes(n - len(out))

    def int(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def pick(self, right, fmt: str):
        """The right value, or (1 time in 4) one from the data."""
        return self.int(fmt) if self.int("B") % 4 == 0 else right


def _desc(src: Source, seq=1) -> bytes:
    # all_reduce(sum) of 16 float32 as collective #seq, the receiver's own call in the slot target
    return DESC.pack(src.pick(seq, "Q"), src.pick(16, "Q"), src.pick(-1, "i"), src.pick(0, "H"),
                     src.pick(0, "B"), src.pick(2, "B"), src.pick(0, "B"))


def slot_input(data: bytes) -> bytes:
    src = Source(data)
    n = src.pick(64, "I")
    header = SLOT.pack(_desc(src), src.pick(64, "Q"), src.pick(0, "Q"), n, src.pick(0, "q"), src.pick(0, "Q"))
    return header + src.take(min(n, 2 * SLOT_BYTES) % (2 * SLOT_BYTES + 1))


def tcp_input(data: bytes) -> bytes:
    if data[:1] and data[0] % 8 == 0:  # raw bytes, one input in eight
        return data[1:]
    src = Source(data)
    out = b""
    for seq in range(src.int("B") % 6):
        kind = src.pick(1, "B")
        n = src.pick(min(src.int("H"), SLOT_BYTES) if kind == 1 else 12, "I")
        slot = SLOT.pack(_desc(src, seq + 1), src.pick(n, "Q"), src.pick(0, "Q"), src.pick(n, "I"), 0, 0)
        before = _desc(src, seq) if seq else bytes(DESC.size)
        frame = FRAME.pack(src.pick(FRAME_MAGIC, "I"), kind, src.pick(0, "B"), 0, n, 0, src.pick(seq, "Q")) + slot + before
        out += frame + src.take(min(n, 4 * SLOT_BYTES))
    cut = src.int("H")
    return out[:cut] if cut % 3 == 0 else out


def check_tcp(stream: bytes) -> str:
    return _C.fuzz_tcp_receive(stream, SLOT_BYTES)


def check_slot(raw: bytes) -> str:
    why = _C.fuzz_slot_receive(raw)
    desc, msg_bytes, offset, length, _, _ = SLOT.unpack(raw[: SLOT.size])
    right = desc == DESC.pack(1, 16, -1, 0, 0, 2, 0) and (msg_bytes, offset, length) == (64, 0, 64)
    if right != (why == ""):
        raise AssertionError(f"slot {raw[:SLOT.size].hex()}: accepted={why == ''} but well-formed={right} ({why})")
    return why


TARGETS = {"tcp": (tcp_input, check_tcp), "slot": (slot_input, check_slot)}


def run_random(target: str, runs: int, seed: int = 0) -> dict:
    """The target on `runs` random inputs (CI's short run); returns how often each outcome came."""
    make, check = TARGETS[target]
    rng = random.Random(seed)
    outcomes: dict = {}
    for _ in range(runs):
        why = check(make(rng.randbytes(rng.randrange(0, 400))))
        key = why.split("(")[0].split(":")[0][:40] if why else "accepted"
        outcomes[key] = outcomes.get(key, 0) + 1
    return outcomes


def main():
    import atheris  # noqa: PLC0415  (optional: only the long runs need it)

    target = sys.argv.pop(1)
    make, check = TARGETS[target]
    atheris.Setup(sys.argv, lambda data: check(make(data)))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
