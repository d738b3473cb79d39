import pytest
import trio

from p2prl.net import chunkproto as cp


class BytesStream:
    """A stream that hands out a fixed byte string in small reads (like a muxed stream)."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        self.data, self.step = data, step

    async def read(self, n: int) -> bytes:
        out, self.data = self.data[: min(n, self.step)], self.data[min(n, self.step) :]
        return out


def test_request_roundtrip_and_bounds() -> None:
    bid, digest = "ab" * 32, "cd" * 32
    raw = cp.encode_request(cp.OP_GET, bid, digest, 5, 1 << 20)
    assert len(raw) == cp.REQUEST_BYTES
    assert cp.decode_request(raw) == (cp.OP_GET, bid, digest, 5, 1 << 20)
    with pytest.raises(cp.ProtocolError):
        cp.decode_request(b"\x09" + raw[1:])
    with pytest.raises(cp.ProtocolError):
        cp.decode_request(raw[:-1])


def test_bitmap_roundtrip_and_mismatch() -> None:
    have = [i % 3 == 0 for i in range(19)]
    enc = cp.encode_bitmap(have)
    assert cp.decode_bitmap(enc, 19) == have
    with pytest.raises(cp.ProtocolError):
        cp.decode_bitmap(enc, 20)
    with pytest.raises(cp.ProtocolError):
        cp.decode_bitmap(enc + b"\x00", 19)


def test_read_response_checks_length_before_reading() -> None:
    async def go() -> None:
        ok = cp.encode_response_header(cp.OK, 10) + b"x" * 10
        assert await cp.read_response(BytesStream(ok), 10, 1.0) == (cp.OK, b"x" * 10)
        with pytest.raises(cp.ProtocolError, match="exceeds"):
            await cp.read_response(BytesStream(cp.encode_response_header(cp.OK, 1 << 30)), 10, 1.0)
        with pytest.raises(cp.ProtocolError, match="stream ended"):
            await cp.read_response(BytesStream(ok[:8]), 10, 1.0)
        with pytest.raises(cp.ProtocolError, match="status"):
            await cp.read_response(BytesStream(b"\x07\x00\x00\x00\x00"), 10, 1.0)
        with pytest.raises(cp.ProtocolError, match="payload"):
            await cp.read_response(BytesStream(cp.encode_response_header(cp.BUSY, 3) + b"abc"), 10, 1.0)

    trio.run(go)


def test_read_times_out() -> None:
    class Silent:
        async def read(self, n: int) -> bytes:
            await trio.sleep_forever()
            return b""

    async def go() -> None:
        with pytest.raises(trio.TooSlowError):
            await cp.read_exactly(Silent(), 4, 0.05)

    trio.run(go)
