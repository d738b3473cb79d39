"""A finished run's summary: per-version rows (the CSV), the checks and the one-line verdict."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from p2prl.dashboard import SUMMARY_CHECKS, per_version, run_checks, run_report, verdict_line, write_csv
from p2prl.demo import summarize

NAMES = ["trainer", "validator", "miner1", "miner2"]
PLAN = {"keys": {"miner1": "a1" * 32, "miner2": "b2" * 32}}


def _rewards(by: dict[int, tuple[float, int]]) -> dict[str, Any]:
    return {str(v): {"mean": m, "count": n} for v, (m, n) in by.items()}


def statuses(miner2_version: int = 3) -> dict[str, dict[str, Any] | None]:
    return {
        "trainer": {
            "role": "trainer",
            "version": 3,
            "counters": {"versions_published": 4, "groups_consumed": 9},
            "reward_by_version": _rewards({0: (0.2, 16), 1: (0.25, 16), 2: (0.3, 8)}),
        },
        "validator": {
            "role": "validator",
            "counters": {"groups_accepted": 5, "groups_rejected": 2},
            "labelled": {"rejected": {"stale": 2}},
            "scores": {"a1" * 32: 40, "b2" * 32: 24},
            "reward_by_version": _rewards({0: (0.2, 16), 1: (0.25, 16), 2: (0.3, 8)}),
        },
        "miner1": {
            "role": "miner",
            "version": 3,
            "reward_by_version": _rewards({0: (0.2, 16), 1: (0.2, 16)}),
        },
        "miner2": {
            "role": "miner",
            "version": miner2_version,
            "reward_by_version": _rewards({1: (0.3, 16), 2: (0.3, 16)}),
        },
    }


def test_per_version_rows_and_csv(tmp_path: Path) -> None:
    st = statuses()
    rows = per_version(st["trainer"], st["validator"], [st["miner1"], st["miner2"], None])
    assert [r["version"] for r in rows] == [0, 1, 2]
    assert rows[1] == {
        "version": 1,
        "reward_mean": 0.25,
        "rollouts_trained": 16,
        "rollouts_produced": 32,
        "rollouts_accepted": 16,
        "acceptance": 0.5,
    }
    assert rows[2]["acceptance"] == 0.5 and rows[0]["acceptance"] == 1.0
    write_csv(rows, tmp_path / "r.csv")
    back = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert back[1] == {k: str(v) for k, v in rows[1].items()} and len(back) == 3
    assert per_version(None, None, []) == []


def test_verdict_ok_lists_versions_sync_verdicts_scores_and_reward() -> None:
    s = summarize(PLAN, statuses(), NAMES)
    line = verdict_line(s)
    assert line.startswith("verdict: OK: 4 versions published (trainer at v3); 2/2 miners on v3"), line
    assert "groups 5 accepted, 2 rejected (stale 2)" in line
    assert "scores miner1 40, miner2 24" in line and "reward 0.240 → 0.240" in line
    report = run_report(s)
    assert report[-1] == line and report[1].startswith("miner1: v3, score 40")
    assert len(s["by_version"]) == 3
    st = statuses()
    st["trainer"]["hashes"] = {"3": "h3"}
    for n, h in (("miner1", "h3"), ("miner2", "hx")):
        st[n]["weights_hash"] = h  # type: ignore[index]
    assert "2/2 miners on v3, other weights: miner2" in verdict_line(summarize(PLAN, st, NAMES))
    st["miner2"]["weights_hash"] = "h3"  # type: ignore[index]
    assert "2/2 miners on v3 with the trainer's weights hash" in verdict_line(summarize(PLAN, st, NAMES))


def test_verdict_names_what_failed_and_takes_the_summarys_own_checks() -> None:
    s = summarize(PLAN, statuses(miner2_version=2), NAMES)
    assert verdict_line(s).startswith("verdict: PROBLEM (in_sync): ")
    assert "1/2 miners on v3 (behind: miner2 v2)" in verdict_line(s)
    s = summarize(PLAN, statuses(), NAMES)
    s["checks"] = {"honest": {"ok": False, "detail": "miner2 scored 0"}, "extra": True}
    assert [c[0] for c in run_checks(s)] == [*(f(s)[0] for f in SUMMARY_CHECKS), "honest", "extra"]
    assert verdict_line(s).startswith("verdict: PROBLEM (honest): ") and "miner2 scored 0" in verdict_line(s)
    assert (
        verdict_line({"error": "trainer exited with 1:\nTraceback"})
        == "verdict: FAILED: trainer exited with 1:"
    )


def test_a_summary_read_while_the_trainer_publishes_counts_one_version_behind_as_in_sync() -> None:
    """Ctrl-C reads the network while versions still come out: a miner one behind is fetching the
    newest patch (in sync), two behind is not; a quiesced run's summary stays strict."""
    s = summarize(PLAN, statuses(miner2_version=2), NAMES)
    s["while_publishing"] = True
    assert verdict_line(s).startswith("verdict: OK: ")
    assert "2/2 miners on v3 or one behind while it spreads (miner2 v2)" in verdict_line(s)
    s = summarize(PLAN, statuses(miner2_version=1), NAMES)
    s["while_publishing"] = True
    assert verdict_line(s).startswith("verdict: PROBLEM (in_sync): ") and "behind: miner2 v1" in verdict_line(s)
    s = summarize(PLAN, statuses(miner2_version=2), NAMES)
    s["while_publishing"] = False
    assert verdict_line(s).startswith("verdict: PROBLEM (in_sync): ")


def test_reward_chart_is_a_png_of_both_series(tmp_path: Path) -> None:
    import struct
    import zlib

    from p2prl.dashboard import write_chart
    from p2prl.dashboard.plot import ACCEPT_RGB, REWARD_RGB

    st = statuses()
    write_chart(per_version(st["trainer"], st["validator"], [st["miner1"], st["miner2"]]), tmp_path / "r.png")
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    w, h = struct.unpack(">II", png[16:24])
    n = struct.unpack(">I", png[33:37])[0]
    assert png[37:41] == b"IDAT" and struct.unpack(">I", png[41 + n : 45 + n])[0] == zlib.crc32(
        png[37 : 41 + n]
    )
    raw = zlib.decompress(png[41 : 41 + n])
    assert len(raw) == h * (1 + 3 * w)
    pixels = {raw[i : i + 3] for y in range(h) for i in range(y * (1 + 3 * w) + 1, (y + 1) * (1 + 3 * w), 3)}
    assert bytes(REWARD_RGB) in pixels and bytes(ACCEPT_RGB) in pixels
    write_chart([], tmp_path / "empty.png")  # a run with no versions still gives a (blank) chart


def test_the_report_says_why_nothing_trained_and_the_held_out_figures() -> None:
    from p2prl.dashboard.summary import learning_lines
    from p2prl.dashboard.view import skipped_notice
    from p2prl.demo.launcher import why_no_training

    skipping = {"counters": {"train_steps": 6, "train_steps_skipped": 6, "versions_published": 1}}
    note = why_no_training(skipping, {})
    assert note.startswith("the trainer skipped all 6 steps: every group's rewards were equal")
    assert "skipped all 6 steps" in skipped_notice([{}, skipping])
    assert why_no_training({"counters": {}}, {}) == (
        "the trainer took no step: the validator accepted no group yet (see rejections)"
    )
    accepted = {"counters": {"groups_accepted": 12}}
    short = why_no_training({"counters": {}, "buffer_groups": 5, "train_batch_groups": 8}, accepted)
    assert short == (
        "the trainer took no step: 12 groups accepted, 5 in its buffer, fewer than one training batch (8 groups)"
    )
    # a step in progress is not "too few groups"
    running = why_no_training({"counters": {}, "buffer_groups": 12, "train_batch_groups": 8, "stepping": True}, accepted)
    assert running.startswith("the trainer's first step was still running at the end (12 groups accepted)")
    trained = {"counters": {"train_steps": 6, "train_steps_skipped": 2, "versions_published": 5}}
    assert why_no_training(trained, {}) == "" and skipped_notice([trained]) == ""
    lines = learning_lines(
        {
            "held_out": {"problems": 32, "first": 0.0, "last": 0.3125, "version": 9, "reward_first": 0.2, "reward_last": 0.5},
            "notice": note,
        }
    )
    assert lines[0] == "held-out accuracy (32 problems, greedy): 0.000 → 0.312 (v9); mean reward 0.200 → 0.500"
    assert lines[1] == f"notice: {note}"
    assert learning_lines({}) == []
    assert learning_lines({"held_out": {"problems": 16, "first": 0.3125, "last": None, "reward_first": 0.48}}) == [
        "held-out accuracy (16 problems, greedy): 0.312, no trained version saved; mean reward 0.480"
    ]
