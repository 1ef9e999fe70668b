"""Prompt packing: layout, the stable prefix, budget priorities and edges (pure logic)."""

from __future__ import annotations

import random

import pytest

from context_engine.errors import InvalidArgument
from inference.tokens import count_tokens
from projections.assembly.packing import HEADINGS, SEPARATOR, VERBATIM, Block, BudgetError, pack, render


def count(text: str) -> int:
    return count_tokens(text, "gpt-4")


def block(kind: str, text: str, key: str = "", score: float | None = None, source: str = "", time: str = "",
          at: tuple[str, str, int] = ("", "", 0)) -> Block:
    return Block(kind, text, key=key or text, score=score, source=source, time=time, at=at)


LAYERS = [block("layer", "L1: be safe."), block("layer", "L2: acme policy.")]
PINNED = [block("pinned", "Pinned fact one.")]
RETRIEVED = [block("retrieved", f"retrieved chunk number {i} about billing", score=0.9 - i / 10, source=f"r{i}")
             for i in range(5)]
HISTORY = [block("history", f"user: turn {i}", source=f"e{i}") for i in range(9, -1, -1)]  # newest first


def packed(budget: int, **overrides):
    args = dict(layers=LAYERS, pinned=PINNED, required=[], retrieved=RETRIEVED, history_newest_first=HISTORY)
    args.update(overrides)
    return pack(**args, budget=budget, count=count)


def test_layout_prefix_and_order():
    p = packed(10_000)
    prefix = p.prompt.encode()[:p.prefix_bytes].decode()
    assert prefix == SEPARATOR.join(
        ["L1: be safe.", "L2: acme policy.", "## Pinned context", "Pinned fact one."]) + SEPARATOR
    tail = p.prompt[len(prefix):]
    assert tail.startswith("## Retrieved context")
    assert (tail.index("retrieved chunk number 0") < tail.index("retrieved chunk number 4")
            < tail.index("## Recent conversation"))
    assert tail.index("user: turn 0") < tail.index("user: turn 9")  # history chronological
    assert p.tokens == count(p.prompt)


def test_the_prefix_does_not_depend_on_the_tail():
    a, b = packed(10_000), packed(10_000, retrieved=[], history_newest_first=HISTORY[:2])
    assert a.prefix_bytes == b.prefix_bytes
    assert a.prompt.encode()[:a.prefix_bytes] == b.prompt.encode()[:b.prefix_bytes]


def test_exactly_at_budget_and_one_token_under():
    full = packed(10_000)
    at = packed(full.tokens)
    assert at.prompt == full.prompt and at.tokens == full.tokens
    under = packed(full.tokens - 1)
    assert under.tokens <= full.tokens - 1
    assert len(under.blocks) == len(full.blocks) - 1


def test_history_is_a_contiguous_recent_window_and_retrieved_by_score():
    full = packed(10_000)
    small = packed(full.tokens - 12)
    kept = [b.text for b in small.blocks if b.kind == "history"]
    assert kept == [f"user: turn {i}" for i in range(10 - len(kept), 10)]  # the newest ones
    tight = packed(sum(count(b.text) for b in LAYERS + PINNED) + 40, history_newest_first=[])
    scores = [b.score for b in tight.blocks if b.kind == "retrieved"]
    assert scores == sorted(scores, reverse=True) and 0 < len(scores) < len(RETRIEVED)


def test_layers_are_never_cut():
    layers_only = pack(layers=LAYERS, pinned=[], required=[], retrieved=[], history_newest_first=[],
                       budget=10_000, count=count)
    with pytest.raises(BudgetError) as err:
        packed(layers_only.tokens - 1)
    assert err.value.field == "token_budget" and "layers" in err.value.message


def test_pinned_and_required_are_all_or_an_error():
    with pytest.raises(BudgetError):
        packed(count("L1: be safe.") + count("L2: acme policy.") + 4)
    with pytest.raises(InvalidArgument):
        packed(0)


def test_a_retrieved_turn_is_not_repeated_in_history():
    history = [block("history", "user: the refund window is 30 days", source="e1")]
    retrieved = [block("retrieved", "user: the refund window is 30 days", key="c1", score=0.8, source="e1")]
    p = packed(10_000, retrieved=retrieved, history_newest_first=history)
    assert p.prompt.count("refund window") == 1


def dialogue(n: int, per_time: int = 4) -> list[Block]:
    """`n` turns newest first, a new time label every `per_time` turns, one chunk each."""
    return [block("history", f"{'user' if i % 2 else 'assistant'}: turn {i} of the talk", key=f"e{i}",
                  source=f"e{i}", time=f"2024-05-0{1 + i // per_time} 10:00") for i in range(n - 1, -1, -1)]


def chunk_of(turn: Block, score: float) -> Block:
    return block("retrieved", turn.text, key=f"c-{turn.source}", score=score, source=turn.source, time=turn.time,
                 at=(turn.time, turn.source, 0))


def test_turns_carry_their_time_once_per_run_and_retrieved_turns_read_oldest_first():
    history = dialogue(12)
    old = [chunk_of(history[-1], 0.5), chunk_of(history[-6], 0.9)]  # turns 0 and 5, the best scored last in time
    p = packed(70 + sum(count(b.text) for b in LAYERS + PINNED + old), retrieved=old, history_newest_first=history)
    tail = p.prompt[p.prefix_bytes:]
    retrieved, recent = tail.split("## Recent conversation")
    assert retrieved.index("turn 0 ") < retrieved.index("turn 5 ")  # by time, not score
    assert retrieved.count("[2024-05-01 10:00]\n") == 1 and retrieved.count("[2024-05-02 10:00]\n") == 1
    kept = [b for b in p.blocks if b.kind == "history"]
    assert kept and kept == list(reversed(history[:len(kept)]))  # a contiguous recent window
    # one header per run of a time in the recent conversation, above its first turn
    runs = [t for i, t in enumerate(b.time for b in kept) if i == 0 or kept[i - 1].time != t]
    assert [line[1:-1] for line in recent.split("\n") if line.startswith("[")] == runs
    assert p.tokens == count(p.prompt)


def test_a_retrieved_turn_the_recent_window_reaches_moves_into_it():
    history = dialogue(10)
    retrieved = [chunk_of(history[2], 0.9), chunk_of(history[8], 0.8)]  # turns 7 and 1
    full = packed(10_000, retrieved=retrieved, history_newest_first=history)
    assert not [b for b in full.blocks if b.kind == "retrieved"] and "## Retrieved context" not in full.prompt
    assert [b.source for b in full.blocks if b.kind == "history"] == [f"e{i}" for i in range(10)]
    # A budget that reaches turn 7 but not turn 1: turn 7 is in its place, turn 1 stays retrieved.
    small = packed(full.tokens - 40, retrieved=retrieved, history_newest_first=history)
    recent = [b.source for b in small.blocks if b.kind == "history"]
    assert "e7" in recent and "e1" not in recent and recent == [f"e{i}" for i in range(10 - len(recent), 10)]
    assert [b.source for b in small.blocks if b.kind == "retrieved"] == ["e1"]
    assert all(small.prompt.count(f"turn {i} ") <= 1 for i in range(10))
    # A budget exactly at a prompt's count gives that prompt, moves and all.
    for p in (full, small):
        assert packed(p.tokens, retrieved=retrieved, history_newest_first=history).prompt == p.prompt


def test_a_pinned_or_required_turn_is_in_the_prompt_once():
    history = dialogue(6)
    pinned = [block("pinned", history[3].text, key="c-e2", source="e2")]
    required = [block("required", history[1].text, key="event:e4", source="e4")]
    retrieved = [chunk_of(history[3], 0.9), chunk_of(history[1], 0.8), block(
        "retrieved", "turn 4 of the talk, its second chunk", key="c-e4-1", score=0.7, source="e4")]
    p = packed(10_000, pinned=pinned, required=required, retrieved=retrieved, history_newest_first=history)
    for i in range(6):
        assert p.prompt.count(f"turn {i} ") == 1, i
    keys = [b.key for b in p.blocks]
    assert len(keys) == len(set(keys)) and "c-e4-1" not in keys  # a required turn's chunks are not retrieved


def test_random_inputs_stay_in_budget_and_show_every_source_once():
    rng = random.Random(7)
    for trial in range(150):
        history = dialogue(rng.randint(0, 30), per_time=rng.randint(1, 6))
        picked = rng.sample(history, k=min(len(history), rng.randint(0, 8)))
        others = [block("retrieved", f"a memory about item {i}", key=f"m{i}", score=rng.random(), source=f"m{i}",
                        time="2024-04-01 09:00, memory", at=("2024-04-01", f"m{i}", 0))
                  for i in range(rng.randint(0, 4))]
        retrieved = sorted([chunk_of(t, rng.random()) for t in picked] + others, key=lambda b: -(b.score or 0))
        budget = rng.randint(60, 600)
        try:
            p = packed(budget, retrieved=retrieved, history_newest_first=history)
        except BudgetError:
            assert budget < count(render(LAYERS + PINNED + history[:1])[0]), trial
            continue
        assert p.tokens == count(p.prompt) <= budget, trial
        assert not history or history[0] in p.blocks, trial  # the newest turn, always
        sources = [b.source for b in p.blocks if b.kind in ("retrieved", "history")]
        assert len(sources) == len(set(sources)), trial
        kept = [b for b in p.blocks if b.kind == "history"]
        assert kept == list(reversed(history[:len(kept)])), trial
        shown = [b for b in p.blocks if b.kind == "retrieved"]
        assert [b.at for b in shown] == sorted(b.at for b in shown), trial


def test_the_newest_turn_is_in_the_prompt_however_much_retrieval_could_fill():
    history = dialogue(8)
    retrieved = [block("retrieved", f"an older matter {i} " + "word " * 40, key=f"x{i}", score=1 - i / 100,
                       source=f"x{i}", time="2024-01-01 09:00", at=("2024-01-01", f"x{i}", 0)) for i in range(30)]
    for budget in (90, 150, 400, 1000):
        p = packed(budget, retrieved=retrieved, history_newest_first=history)
        assert history[0] in p.blocks and p.tokens <= budget, budget
        assert p.prompt.rstrip().endswith(history[0].text)  # the last thing the prompt says


def test_a_budget_below_the_newest_turn_is_refused_naming_it():
    history = dialogue(3)
    need = count(render(LAYERS + PINNED + history[:1])[0])
    assert history[0] in packed(need, history_newest_first=history).blocks
    with pytest.raises(BudgetError, match=r"newest turn \(e2\) needs") as err:
        packed(need - 1, history_newest_first=history)
    assert err.value.reason == "TOKEN_BUDGET_TOO_SMALL" and err.value.field == "token_budget"


def test_the_reserved_window_is_packed_before_retrieval():
    history = dialogue(20)
    retrieved = [block("retrieved", f"an older matter {i} " + "word " * 20, key=f"x{i}", score=1 - i / 100,
                       source=f"x{i}", time="2024-01-01 09:00", at=("2024-01-01", f"x{i}", 0)) for i in range(60)]
    prefix = count(render(LAYERS + PINNED)[0])
    kept_turns = []
    for share in (0.0, 0.1, 0.25, 0.5):
        p = pack(layers=LAYERS, pinned=PINNED, required=[], retrieved=retrieved, history_newest_first=history,
                 budget=600, count=count, recent_share=share)
        kept = [b for b in p.blocks if b.kind == "history"]
        assert kept == list(reversed(history[:len(kept)]))
        window = count(render(LAYERS + PINNED + kept)[0]) - prefix
        turn = max(count(b.text + SEPARATOR) for b in history) + count("[2024-05-05 10:00]\n")
        whole = count(render(LAYERS + PINNED + history[::-1])[0]) - prefix
        assert window > min(share * 600, whole) - turn, share  # the reserve is filled before retrieval
        assert any(b.kind == "retrieved" for b in p.blocks)
        kept_turns.append(len(kept))
    assert kept_turns == sorted(kept_turns) and kept_turns[-1] > kept_turns[0]


def summary_line(i: int, text: str, time: str) -> Block:
    return Block("history", text, key=f"line-{i}", source=f"line-{i}", time=f"{time}, summary of earlier turns",
                 stands_for=f"e{i}")


def test_a_retrieved_turn_takes_the_place_of_its_summary_line():
    turns = dialogue(12)  # e11 … e0
    recent = turns[:4]  # e11 … e8 verbatim
    lines = [summary_line(i, f"user: line for {i}", "2024-05-01 10:00") for i in range(7, -1, -1)]
    history = recent + lines
    retrieved = [chunk_of(turns[-4], 0.9)]  # turn 3, which line-3 stands for
    p = packed(10_000, retrieved=retrieved, history_newest_first=history)
    assert "line for 3" not in p.prompt and p.prompt.count("turn 3 of the talk") == 1
    assert "## Retrieved context" not in p.prompt
    shown = [b for b in p.blocks if b.kind == "history"]
    swapped = next(b for b in shown if b.source == "e3")
    assert swapped.chunks == ("c-e3",) and swapped.key == "line-3"
    assert [b.key for b in shown] == [b.key for b in reversed(history)]  # in the line's place
    # A budget that does not reach the line: the turn stays retrieved, the line is not shown.
    small = packed(count(render(LAYERS + PINNED)[0]) + 60, retrieved=retrieved, history_newest_first=history)
    assert "turn 3 of the talk" in small.prompt and "line for 3" not in small.prompt


def test_a_pinned_turn_is_not_shown_again_as_its_summary_line():
    lines = [summary_line(i, f"user: line for {i}", "2024-05-01 10:00") for i in range(3, -1, -1)]
    history = dialogue(6)[:2] + lines
    pinned = [block("pinned", "user: turn 2 of the talk", key="c-e2", source="e2")]
    p = packed(10_000, pinned=pinned, history_newest_first=history)
    assert "line for 2" not in p.prompt and "line for 1" in p.prompt


def test_same_inputs_same_bytes():
    assert packed(300).prompt == packed(300).prompt


def test_block_costs_add_up_so_the_whole_prompt_is_counted_about_once():
    # Sentences end in punctuation, which cl100k merges with the separator after it (".\n\n" is
    # one token): counting the separator apart over-counted a token a block, and the fill then
    # recounted the whole prompt for each block it added back.
    retrieved = [block("retrieved", f"Caroline said the support group met on day {i}.", score=1 - i / 1000,
                       source=f"r{i}") for i in range(300)]
    whole_prompt_counts = 0

    def counting(text: str) -> int:
        nonlocal whole_prompt_counts
        whole_prompt_counts += text.startswith(LAYERS[0].text) and len(text) > 1000
        return count(text)

    p = pack(layers=LAYERS, pinned=[], required=[], retrieved=retrieved, history_newest_first=[],
             budget=2000, count=counting)
    assert p.tokens == count(p.prompt) <= 2000
    left = [b for b in retrieved if b not in p.blocks]
    assert left and all(count(p.prompt + SEPARATOR + b.text) > 2000 for b in left[:20])  # nothing else fits
    assert whole_prompt_counts <= 2


def test_a_budget_exactly_at_what_must_be_included_is_enough():
    # Layers ending in a word: their joined text is one token short of the prompt, which always
    # ends the stable prefix with a separator.
    layers = [block("layer", "You are helpful"), block("layer", "Follow acme policy")]
    exact = count(SEPARATOR.join(b.text for b in layers) + SEPARATOR)
    p = pack(layers=layers, pinned=[], required=[], retrieved=[], history_newest_first=[], budget=exact,
             count=count)
    assert p.tokens == exact
    with pytest.raises(BudgetError, match="layers alone"):
        pack(layers=layers, pinned=[], required=[], retrieved=[], history_newest_first=[], budget=exact - 1,
             count=count)
    required = [block("required", "the invoice number is 4711", key="semantic")]
    with_required = count(render(layers + required)[0])
    p = pack(layers=layers, pinned=[], required=required, retrieved=[], history_newest_first=[],
             budget=with_required, count=count)
    assert p.tokens == with_required and "4711" in p.prompt
    with pytest.raises(BudgetError, match="required items"):
        pack(layers=layers, pinned=[], required=required, retrieved=[], history_newest_first=[],
             budget=with_required - 1, count=count)


def test_a_retrieved_turn_too_big_for_the_budget_still_takes_its_line_s_place_when_the_difference_fits():
    turns = dialogue(6)
    lines = [summary_line(i, f"user: line {i}", "2024-05-01 10:00") for i in range(3, -1, -1)]
    history = turns[:2] + lines
    original = block("retrieved", "user: line 2, said at length with every detail of the order", key="c-e2",
                     score=0.9, source="e2", time="2024-05-01 10:00", at=("2024-05-01 10:00", "e2", 0))
    without = packed(10_000, retrieved=[], history_newest_first=history)
    extra = count(VERBATIM + original.text + SEPARATOR) - count("user: line 2" + SEPARATOR)
    budget = without.tokens + extra + 1  # not enough for the turn and its line, enough for the turn instead
    assert count(original.text + SEPARATOR) + count(HEADINGS["retrieved"] + SEPARATOR) > extra + 1
    p = packed(budget, retrieved=[original], history_newest_first=history)
    assert "said at length" in p.prompt and "user: line 2\n" not in p.prompt + "\n" and p.tokens <= budget
    assert [b.key for b in p.blocks if b.kind == "history"] == [b.key for b in reversed(history)]
