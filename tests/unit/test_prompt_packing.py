"""Prompt packing: layout, the stable prefix, budget priorities and edges (pure logic)."""

from __future__ import annotations

import pytest

from context_engine.errors import InvalidArgument
from inference.tokens import count_tokens
from projections.prompt_packing import SEPARATOR, Block, BudgetError, pack, render


def count(text: str) -> int:
    return count_tokens(text, "gpt-4")


def block(kind: str, text: str, key: str = "", score: float | None = None, source: str = "") -> Block:
    return Block(kind, text, key=key or text, score=score, source=source)


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
