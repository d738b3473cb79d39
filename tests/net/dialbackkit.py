"""A raw dial-back request, as any peer can send one: what the helper answers, or why it did not."""

from __future__ import annotations

from p2prl.net import dialback
from p2prl.net.node import P2PNode


async def ask_raw(node: P2PNode, peer: str, payload: bytes) -> bytes:
    """Send ``payload`` on a new dial-back stream to ``peer``; the answer's bytes, or the error's repr."""
    from libp2p.peer.id import ID

    stream = None
    try:
        stream = await node._host.new_stream(ID.from_base58(peer), [dialback.PROTOCOL_ID])
        await stream.write(payload)
        return await stream.read(1024)
    except Exception as e:  # a refused request is reset, even before negotiation completes
        return repr(e).encode()
    finally:
        if stream is not None:
            await stream.close()
