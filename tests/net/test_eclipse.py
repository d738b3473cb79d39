"""Item 6 of docs/SECURITY.md: peers that claim a blob (provider hints) must not starve its holder."""

import pytest

from p2prl.bench.peerproc import blob_bytes
from p2prl.net.config import Limits, NetConfig
from p2prl.protocol.blobs import blob_ref_for

CH = 64 * 1024


def eclipse(make_node, victim_config: NetConfig):
    """A victim that pulls from at most 3 providers; 3 Sybils hinted as holders, serving nothing;
    the real holder connected but not hinted."""
    holder = make_node("holder")
    victim = make_node("victim", config=victim_config)
    data = blob_bytes(6, 8 * CH)
    ref = blob_ref_for(data, CH)
    holder.store.put(data)
    holder.serve(ref)
    for i in range(3):
        sybil = make_node(f"sybil{i}")
        victim.connect(sybil.addrs[0])
        victim.add_provider_hint(ref.id, sybil.peer_id)
    victim.connect(holder.addrs[0])
    return holder, victim, ref, data


@pytest.mark.slow
def test_hints_that_do_not_deliver_are_retired(make_node) -> None:
    _, victim, ref, data = eclipse(make_node, NetConfig(limits=Limits(max_providers=3)))
    assert victim.fetch(ref, timeout=8, s3=False).read_bytes() == data
    assert victim.stats().get("providers_retired", 0) >= 1


def test_the_announcer_always_gets_a_slot(make_node) -> None:
    # Sybils are never retired here (a long grace): only the announcer's reserved slot can help
    cfg = NetConfig(limits=Limits(max_providers=3), hint_grace_s=600.0)
    holder, victim, ref, data = eclipse(make_node, cfg)
    assert victim.fetch(ref, timeout=5, s3=False, prefer=[holder.peer_id]).read_bytes() == data
