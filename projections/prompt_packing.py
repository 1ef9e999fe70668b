"""Packing an assembled prompt within a token budget: pure, deterministic, no I/O.

Layout (ARCHITECTURE.md section 8), blocks separated by a blank line:

    <L1> <L2> <L3> <L4>                              guardrail layers, verbatim, never cut
    ## Pinned context  <pinned chunks>               (only when there are pinned chunks)
    ---------------------------------------------  end of the stable prefix (cache_prefix_bytes)
    ## Required context  <must_include items>
    ## Retrieved context  <retrieved chunks, best first>
    ## Recent conversation  <session history, oldest first>

The stable prefix ends with the separator, so its bytes are the same whatever tail follows it.
Sections with no block are left out with their heading.

Budget (tokens of the whole prompt with the target model's encoding), by priority:
1. layers: if they alone exceed the budget, `BudgetError` naming them; nothing is assembled;
2. pinned chunks, then must_include items: all of them or `BudgetError` (they were asked for);
3. retrieved chunks by score: each that fits is taken, one that does not is skipped;
4. history newest first: taken while it fits, stopping at the first that does not (a contiguous
   recent window), then put back in chronological order. A turn already in the prompt as a
   retrieved chunk is not repeated.
A block costs the tokens of its text with the separator after it: the encoders split before a
block's first character, and a separator after punctuation merges into it (cl100k: ".\n\n" is one
token), so these costs add up to the prompt's count in the common case (counting the separator
apart over-counted ~1 token a block, ~95 at a 4,000-token budget, which the fill below then
recovered with a count of the whole prompt per block). The final prompt is counted once more
and, if the encoder merged differently across a boundary, the lowest-priority block is dropped
until it fits; what is left is filled in the same priority order, each addition checked by a
count of the whole prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from context_engine.errors import InvalidArgument

SEPARATOR = "\n\n"
HEADINGS = {
    "pinned": "## Pinned context",
    "required": "## Required context",
    "retrieved": "## Retrieved context",
    "history": "## Recent conversation",
}
TAIL_ORDER = ("required", "retrieved", "history")
# A block whose estimated cost is over the slack by more than this is not tried in the fill: one
# token for the trailing separator `used` counts, one for a merge across the block's boundary.
FILL_TOLERANCE = 2

Count = Callable[[str], int]


@dataclass(frozen=True)
class Block:
    kind: str  # layer | pinned | required | retrieved | history
    text: str
    key: str = ""  # chunk id, event id, layer level...: identity within its kind
    score: float | None = None  # retrieved blocks: the fused retrieval score
    source: str = ""  # the event the text came from: a turn already retrieved is not repeated


@dataclass(frozen=True)
class Packed:
    prompt: str
    prefix_bytes: int
    tokens: int
    blocks: tuple[Block, ...]  # included, in prompt order


class BudgetError(InvalidArgument):
    def __init__(self, message: str) -> None:
        super().__init__("token_budget", message, reason="TOKEN_BUDGET_TOO_SMALL")


def render(blocks: Sequence[Block]) -> tuple[str, int]:
    """The prompt text of `blocks` (already in priority-free prompt order) and its prefix bytes."""
    layers = [b.text for b in blocks if b.kind == "layer"]
    pinned = [b.text for b in blocks if b.kind == "pinned"]
    prefix_parts = layers + ([HEADINGS["pinned"], *pinned] if pinned else [])
    prefix = SEPARATOR.join(prefix_parts) + SEPARATOR if prefix_parts else ""
    tail_parts: list[str] = []
    for kind in TAIL_ORDER:
        texts = [b.text for b in blocks if b.kind == kind]
        if texts:
            tail_parts += [HEADINGS[kind], *texts]
    return prefix + SEPARATOR.join(tail_parts), len(prefix.encode("utf-8"))


def _ordered(blocks: Sequence[Block]) -> list[Block]:
    order = {"layer": 0, "pinned": 1, "required": 2, "retrieved": 3, "history": 4}
    history = [b for b in blocks if b.kind == "history"]
    rest = sorted((b for b in blocks if b.kind != "history"),  # stable within layers, pinned, required
                  key=lambda b: (order[b.kind], -(b.score or 0.0) if b.kind == "retrieved" else 0.0))
    return rest + history


def pack(*, layers: Sequence[Block], pinned: Sequence[Block], required: Sequence[Block],
         retrieved: Sequence[Block], history_newest_first: Sequence[Block], budget: int,
         count: Count) -> Packed:
    if budget < 1:
        raise InvalidArgument("token_budget", f"must be a positive number of tokens, got {budget}")
    def cost(text: str) -> int:
        return count(text + SEPARATOR)

    # What must be in the prompt is judged on its real text, so a budget exactly at its count is
    # enough. (Layer and pinned counts are remembered; they repeat call after call.)
    chosen: list[Block] = list(layers)
    used = count(render(chosen)[0]) if chosen else 0
    if used > budget:
        raise BudgetError(f"the guardrail layers alone need {used} tokens, more than the budget "
                          f"of {budget}; layers are never cut")
    for kind, group in (("pinned", pinned), ("required", required)):
        if not group:
            continue
        need = count(render([*chosen, *group])[0])
        if need > budget:
            raise BudgetError(f"the layers and the {kind} items ({', '.join(b.key for b in group)}) need "
                              f"{need} tokens, more than the budget of {budget}")
        used = need
        chosen += group
    # From here each block adds its estimated cost; after the stable prefix `used` then counts a
    # separator the prompt will not end with: at most a token too many, never too few.

    def take(kind: str, candidates: Sequence[Block], *, stop_at_first_miss: bool,
             skip_sources: frozenset[str] = frozenset()) -> list[Block]:
        nonlocal used
        taken: list[Block] = []
        heading = cost(HEADINGS[kind])
        for b in candidates:
            if b.source and b.source in skip_sources:
                continue
            extra = cost(b.text) + (0 if taken else heading)
            if used + extra <= budget:
                taken.append(b)
                used += extra
            elif stop_at_first_miss:
                break
        return taken

    in_prompt = {b.key for b in chosen}
    candidates = [b for b in retrieved if b.key not in in_prompt]
    got = take("retrieved", candidates, stop_at_first_miss=False)
    chosen += got
    skip = frozenset(b.source for b in got)
    recent = take("history", history_newest_first, stop_at_first_miss=True, skip_sources=skip)
    chosen += list(reversed(recent))
    blocks = _ordered(chosen)
    while True:
        prompt, prefix_bytes = render(blocks)
        tokens = count(prompt)
        if tokens <= budget:
            break
        droppable = [i for i, b in enumerate(blocks) if b.kind in ("history", "retrieved")]
        if not droppable:  # cannot happen with a consistent counter; never return over budget
            raise BudgetError(f"the required prompt needs {tokens} tokens, more than the budget of {budget}")
        history = [i for i in droppable if blocks[i].kind == "history"]
        blocks.pop(history[0] if history else droppable[-1])  # oldest history, then lowest score
    # Estimated costs can miss the real count by a token or so either way where the encoder
    # merges across a boundary: fill what is left in the same priority order, checking the real count.
    taken_keys = {(b.kind, b.key) for b in blocks}
    kinds = {b.kind for b in blocks}
    slack = budget - tokens
    fill = [b for b in candidates if ("retrieved", b.key) not in taken_keys]
    retrieved_sources = {x.source for x in blocks if x.kind == "retrieved"}
    older = [b for b in history_newest_first if ("history", b.key) not in taken_keys
             and not (b.source and b.source in retrieved_sources)]
    for b in [*fill, *older]:
        heading = 0 if b.kind in kinds else cost(HEADINGS[b.kind])
        if cost(b.text) + heading > slack + FILL_TOLERANCE:
            if b.kind == "history":
                break
            continue
        trial = _ordered([*blocks, b]) if b.kind == "retrieved" else _with_older_history(blocks, b)
        trial_prompt, trial_prefix = render(trial)
        trial_tokens = count(trial_prompt)
        if trial_tokens <= budget:
            blocks, prompt, prefix_bytes, tokens = trial, trial_prompt, trial_prefix, trial_tokens
            slack = budget - tokens
            kinds.add(b.kind)
        elif b.kind == "history":
            break
    return Packed(prompt, prefix_bytes, tokens, tuple(blocks))


def _with_older_history(blocks: list[Block], older: Block) -> list[Block]:
    """`older` is older than every history block present: it goes first among them."""
    rest = [b for b in blocks if b.kind != "history"]
    return rest + [older] + [b for b in blocks if b.kind == "history"]
