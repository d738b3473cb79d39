"""The swarm's I/O-free decisions: rarest-first chunk choice and the superseeding rule."""

from __future__ import annotations

import random

from p2prl.net.selection import may_upload_copy, pick_chunk, provider_order


def test_pick_prefers_the_rarest_chunk_and_skips_held_inflight_and_busy() -> None:
    bitmaps = {
        "a": [True, True, True, True],
        "b": [True, True, False, False],
        "c": [True, False, False, False],
    }
    have = [True, False, False, False]
    got = pick_chunk("b", bitmaps["b"], have, set(), {}, bitmaps, now=10.0, last_peer_progress=0.0)
    assert got == 1  # chunk 0 held; chunk 1 is the only other one b has
    assert pick_chunk("b", bitmaps["b"], have, {1}, {}, bitmaps, 10.0, 0.0) is None
    assert pick_chunk("b", bitmaps["b"], have, set(), {("b", 1): 11.0}, bitmaps, 10.0, 0.0) is None


def test_a_complete_holder_is_asked_only_for_what_no_partial_holder_has() -> None:
    bitmaps = {"pub": [True] * 4, "x": [False, True, True, False]}
    have = [False] * 4
    rng = random.Random(0)
    picks = {pick_chunk("pub", bitmaps["pub"], have, set(), {}, bitmaps, 5.0, 0.0, rng) for _ in range(50)}
    assert picks == {0, 3}
    # nothing rare left and partial holders progressed within a second: spare the complete holder
    have = [True, False, False, True]
    assert pick_chunk("pub", bitmaps["pub"], have, set(), {}, bitmaps, 5.0, 4.5) is None
    assert pick_chunk("pub", bitmaps["pub"], have, set(), {}, bitmaps, 5.0, 3.0) in (1, 2)


def test_superseed_allows_the_kth_copy_k_minus_1_cooldowns_after_the_first() -> None:
    uploads: dict[tuple[str, int], tuple[int, float]] = {}
    key = ("blob", 0)
    assert may_upload_copy(uploads, key, 100.0, 10.0)
    assert not may_upload_copy(uploads, key, 105.0, 10.0)
    assert may_upload_copy(uploads, key, 110.0, 10.0)
    assert not may_upload_copy(uploads, key, 119.0, 10.0)
    assert may_upload_copy(uploads, key, 120.0, 10.0)
    assert may_upload_copy(uploads, ("blob", 1), 119.0, 10.0)


def test_provider_order_hinted_first_then_an_own_stable_order_per_node() -> None:
    peers = [f"peer{i:03d}" for i in range(40)]
    order = provider_order("me", "blob", ["h1", "h2"], peers)
    assert order[:2] == ["h1", "h2"] and sorted(order[2:]) == peers
    # stable while peers come and go: a newcomer is slotted in, the others keep their order
    again = provider_order("me", "blob", ["h1", "h2"], [*peers, "late"])
    assert [p for p in again if p != "late"] == order
    # every downloader (and every blob) has its own order: the first 16 picks cover almost everyone
    firsts = {p for i in range(32) for p in provider_order(f"node{i}", "blob", [], peers)[:16]}
    assert len(firsts) >= 38
    assert provider_order("me", "other", [], peers) != order[2:]
