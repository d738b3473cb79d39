from decimal import Decimal

import pytest

from p2prl.rl.tasks import (
    AdditionTask,
    GSM8KTask,
    derive_seed,
    file_sha256,
    get_task,
    parse_final_answer,
    seed_ints,
)


def test_derive_seed_is_sha256_of_documented_layout() -> None:
    import hashlib

    h = "ab" * 32
    key = bytes(range(32))
    want = hashlib.sha256(bytes.fromhex(h) + key + (7).to_bytes(8, "big")).digest()
    assert derive_seed(h, key, 7) == want
    assert derive_seed(h, key, 8) != want
    assert derive_seed(h, bytes(32), 7) != want
    with pytest.raises(ValueError):
        derive_seed("not hex", key, 0)
    with pytest.raises(ValueError):
        derive_seed(h, key, 2**64)


def test_addition_problem_is_deterministic_and_in_range() -> None:
    task = get_task("addition", digits=3)
    seeds = [derive_seed("00" * 32, b"k", i) for i in range(300)]
    probs = [task.problem(s) for s in seeds]
    assert probs == [task.problem(s) for s in seeds]
    for p in probs:
        a, b = p.meta["a"], p.meta["b"]
        assert 0 <= a < 1000 and 0 <= b < 1000
        assert p.prompt == f"{a}+{b}=" and p.answer == str(a + b)
    lengths = {len(str(p.meta["a"])) for p in probs}
    assert lengths == {1, 2, 3}
    assert len({p.prompt for p in probs}) > 250


def test_addition_reward_right_wrong_malformed() -> None:
    task = AdditionTask(digits=2)
    p = task.problem(b"x")
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, str(int(p.answer) + 1)) == 0.0
    assert task.reward(p, "") == 0.0
    assert task.reward(p, p.answer + "0") == 0.0
    assert task.reward(p, " " + p.answer) == 0.0
    assert task.reward(p, "1+1=") == 0.0
    assert task.reward(p, "\x00\uffff") == 0.0


def test_parse_final_answer() -> None:
    assert parse_final_answer("so 3 + 4 = 7\n#### 7") == Decimal(7)
    assert parse_final_answer("#### 1,234") == Decimal(1234)
    assert parse_final_answer("it costs $12.50.") == Decimal("12.5")
    assert parse_final_answer("first 3 then 5 and finally -8") == Decimal(-8)
    assert parse_final_answer("#### 4 and later 9 #### 10") == Decimal(10)
    assert parse_final_answer("no number here") is None
    assert parse_final_answer("#### nothing") is None


def test_gsm8k_sample_and_reward(tmp_path) -> None:
    task = get_task("gsm8k")
    assert isinstance(task, GSM8KTask) and len(task.items) >= 5
    p = task.problem(b"seed")
    assert p == task.problem(b"seed")
    assert p.meta["index"] == seed_ints(b"seed", 1)[0] % len(task.items)  # the documented draw
    assert p.prompt.startswith("Question: ") and p.prompt.endswith("Answer:")
    assert task.reward(p, f"Let me think.\n#### {p.answer}") == 1.0
    assert task.reward(p, f"the answer is {p.answer}") == 1.0
    assert task.reward(p, f"#### {p.answer}1") == 0.0
    assert task.reward(p, "I don't know") == 0.0
    assert task.reward(p, "") == 0.0
    f = tmp_path / "d.jsonl"
    f.write_text(
        '{"question": "q1", "answer": "x\\n#### 1,000"}\n\n{"question": "q2", "answer": "#### 0.50"}\n'
    )
    t2 = get_task("gsm8k", path=f, data_sha256=file_sha256(f))
    assert [a for _, a in t2.items] == ["1000", "0.5"]
    p1 = next(t2.problem(bytes([i])) for i in range(64) if t2.problem(bytes([i])).meta["index"] == 0)
    assert (
        t2.reward(p1, "#### 1000") == 1.0 and t2.reward(p1, "1,000.") == 1.0 and t2.reward(p1, "100") == 0.0
    )


def test_gsm8k_rejects_bad_files(tmp_path) -> None:
    f = tmp_path / "bad.jsonl"
    for text, why in [
        ('{"question": "q", "answer": "no final number"}\n', "no final number"),
        ("", "no records"),
        ('{"question": "q", "answer": "#### 1"}\nnot json\n', "line 2: not JSON"),
        ('["q", "#### 1"]\n', "JSON object"),
        ('{"question": 3, "answer": "#### 1"}\n', "string 'question'"),
    ]:
        f.write_text(text)
        with pytest.raises(ValueError, match=why):
            GSM8KTask(f, data_sha256=file_sha256(f))
    with pytest.raises(ValueError, match="cannot read data file"):
        GSM8KTask(tmp_path / "missing.jsonl", data_sha256="00" * 32)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError):
        GSM8KTask(f, data_sha256=file_sha256(f))


def test_data_file_is_pinned_by_sha256(tmp_path) -> None:
    import hashlib

    f = tmp_path / "d.jsonl"
    f.write_text('{"question": "q", "answer": "#### 7"}\n')
    h = file_sha256(f)
    assert h == hashlib.sha256(f.read_bytes()).hexdigest()
    assert get_task("gsm8k", path=str(f), data_sha256=h.upper()).data_sha256 == h
    with pytest.raises(ValueError, match=f"needs data_sha256 \\(its hash is {h}\\)"):
        get_task("gsm8k", path=str(f))  # a file nobody pinned is refused
    f.write_text('{"question": "q", "answer": "#### 8"}\n')  # one byte changed
    with pytest.raises(ValueError, match=f"has sha256 {file_sha256(f)}, the genesis pins {h}"):
        get_task("gsm8k", path=str(f), data_sha256=h)
    with pytest.raises(ValueError, match="64 hex"):
        get_task("gsm8k", path=str(f), data_sha256="xyz")
    sample = get_task("gsm8k")  # the packaged sample: checked too when a hash is given
    assert get_task("gsm8k", data_sha256=sample.data_sha256).items == sample.items
    with pytest.raises(ValueError, match="the genesis pins"):
        get_task("gsm8k", data_sha256=h)


def test_gsm8k_parquet_needs_pyarrow_or_reads_it(tmp_path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        f = tmp_path / "d.parquet"
        f.write_bytes(b"PAR1")
        with pytest.raises(ValueError, match="needs pyarrow"):
            get_task("gsm8k", path=f, data_sha256=file_sha256(f))
        return
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["q1", "q2"], "answer": ["#### 3", "#### 4"]}), f)
    t = get_task("gsm8k", path=f, data_sha256=file_sha256(f))
    assert [a for _, a in t.items] == ["3", "4"]


def test_gsm8k_unsupported_file_type(tmp_path) -> None:
    f = tmp_path / "d.csv"
    f.write_text("q,a\n")
    with pytest.raises(ValueError, match=r"unsupported task file type '\.csv'"):
        get_task("gsm8k", path=f, data_sha256=file_sha256(f))


def test_unknown_task() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        get_task("chess")


def test_digit_start_rewards_the_first_character_only() -> None:
    task = get_task("digit-start", digits=1)
    p = task.problem(b"\x07" * 32)
    assert p.prompt == get_task("addition", digits=1).problem(b"\x07" * 32).prompt
    assert [task.reward(p, c) for c in ("7", "12abc", "x1", "", " 3", "٣")] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_addition_chat_style_reads_the_stated_answer_and_shapes_credit() -> None:
    from p2prl.rl.tasks.addition import stated_answer

    task = AdditionTask(digits=2, style="chat")
    p = task.problem(b"x")
    a, b, s = p.meta["a"], p.meta["b"], int(p.answer)
    assert p.prompt == f"What is {a} + {b}? Answer with the number only."
    assert get_task("addition", digits=2).problem(b"x").prompt == f"{a}+{b}="  # the toy's default is kept
    # right, however it is written: the number alone, the equation, a sentence
    for right in (f"{s}", f" {s}.", f"{a} + {b} = {s}", f"The answer is {s}. Indeed {a}+{b}={s}"):
        assert task.correct(p, right) and task.reward(p, right) == 1.0
    # wrong: credit for a number (0.1), for the number alone (0.2), for closeness (up to 0.3)
    assert task.reward(p, "no idea") == 0.0 and not task.correct(p, "no idea")
    assert task.reward(p, "") == 0.0
    assert task.reward(p, f"{s + 1}") > task.reward(p, f"{s + 50}") > 0.3
    assert task.reward(p, f"{s + 1}") > task.reward(p, f"It is {s + 1}") > task.reward(p, "It is -999")
    assert task.reward(p, "It is -999") == 0.1
    # the stated answer: after the first '=', else the first integer; the equation's operands do not count
    assert stated_answer(f"{a} + {b} = {s + 2}") == (s + 2, False)
    assert stated_answer(f"{s}.") == (s, True)
    assert stated_answer("x" * 300 + "5") == (None, False)  # only the first 256 characters are read
    assert stated_answer("9" * 40) == (9_999_999_999_999_999_999, False)  # at most 19 digits at once
    # every reward is in [0, 1] and a float the same on every machine (thousandths)
    for text in ["1", "99999", "-5", "=", "= =7", "\x00\uffff", "3 + 4 = 7 = 8"]:
        r = task.reward(p, text)
        assert 0.0 <= r <= 1.0 and round(r * 1000) == r * 1000
    with pytest.raises(ValueError, match="style must be one of exact, chat"):
        get_task("addition", style="verbose")


def test_addition_exact_style_correct_is_its_reward() -> None:
    task = AdditionTask(digits=2)
    p = task.problem(b"y")
    assert task.correct(p, p.answer) and not task.correct(p, f"{p.meta['a']}+{p.meta['b']}={p.answer}")
