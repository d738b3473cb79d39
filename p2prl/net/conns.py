"""Which connections run through a relay: their streams carry control traffic, never chunks."""

from __future__ import annotations

from typing import Any


def is_relayed(muxed_conn: Any) -> bool:
    """Whether a (muxed) connection runs through a circuit relay."""
    try:
        if getattr(muxed_conn.get_connection_type(), "name", "") == "RELAYED":
            return True
        return any("/p2p-circuit" in str(a) for a in muxed_conn.get_transport_addresses() or ())
    except Exception:
        return False


def direct_peers(host: Any) -> set[str]:
    """Peers we hold at least one direct (not relayed) connection to."""
    return {
        pid.to_base58()
        for pid, conns in host.get_network().get_connections_map().items()
        if any(not is_relayed(getattr(c, "muxed_conn", c)) for c in conns)
    }


async def close_relayed_beside_direct(host: Any) -> int:
    """Close relayed connections to peers we also reach directly (after a hole punch): new streams
    would otherwise be spread over both. Returns how many were closed."""
    closed = 0
    for conns in list(host.get_network().get_connections_map().values()):
        legs = [(c, is_relayed(getattr(c, "muxed_conn", c))) for c in conns]
        if any(not r for _, r in legs):
            for c, r in legs:
                if r:
                    try:
                        await c.close()
                        closed += 1
                    except Exception:
                        pass
    return closed
