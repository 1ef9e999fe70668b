"""Packing an assembled prompt within a token budget: pure, deterministic, no I/O.

Layout (ARCHITECTURE.md section 8), blocks separated by a blank line:

    <L1> <L2> <L3> <L4>                              guardrail layers, verbatim, never cut
    ## Pinned context  <pinned chunks>               (only when there are pinned chunks)
    ---------------------------------------------  end of the stable prefix (cache_prefix_bytes)
    ## Required context  <must_include items>
    ## Retrieved context  <retrieved chunks, oldest first>
    ## Recent conversation  <session history, oldest first>

The stable prefix ends with the separator, so its bytes are the same whatever tail follows it.
Sections with no block are left out with their heading. In the tail a turn carries its time
(`Block.time`, projections/assembly/turn_labels.py): `[time]` opens the first turn of each run of turns
with the same time label, so a conversation reads as dated runs of `speaker: text` lines.

Budget (tokens of the whole prompt with the target model's encoding), by priority:
1. layers: if they alone exceed the budget, `BudgetError` naming them; nothing is assembled;
2. pinned chunks, then must_include items: all of them or `BudgetError` (they were asked for);
3. the newest turn: always, or `BudgetError` naming it (the turn the agent must answer);
4. the reserved recent window: the turns before it, newest first, while the window (the newest
   turn included) costs at most `recent_share` of the budget;
5. retrieved chunks by score: each that fits is taken, one that does not is skipped;
6. the rest of the history newest first: the window grows while it fits, stopping at the first
   turn that does not (a contiguous recent window), then put back in chronological order.
Each chunk and turn is in the prompt once: a pinned chunk is not retrieved again nor its turn
shown in history, a required turn or memory is neither, and a retrieved turn that the recent window reaches moves
there, in its place (the budget its chunks took pays for it), so the recent conversation has no
gaps and the retrieved section holds what is older than it, or elsewhere. A compaction
summary's line (`Block.stands_for`: the turn it stands for) gives its place to that turn when
the turn is retrieved: the turn is shown there, once, marked `(verbatim) ` in its summary's run,
and the line is not spent; the window counts the turn at the line's place, and the fill swaps a
line for its turn when the difference fits.
A block costs the tokens of its text with the separator after it (and its time header if it is
the first of its time): the encoders split before a block's first character, and a separator
after punctuation merges into it (cl100k: ".\n\n" is one token), so these costs add up to the
prompt's count in the common case (counting the separator apart over-counted ~1 token a block,
~95 at a 4,000-token budget, which the fill below then recovered with a count of the whole
prompt per block). The final prompt is counted once more and, if the encoder merged differently
across a boundary, the lowest-priority block is dropped until it fits; what is left is filled in
the same priority order, each addition checked by a count of the whole prompt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from context_engine.errors import InvalidArgument
from projections.assembly.turn_labels import header

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
# Windows of recent history whose estimate is just over the budget that are counted for real.
WINDOW_RECOUNTS = 2

Count = Callable[[str], int]


@dataclass(frozen=True)
class Block:
    kind: str  # layer | pinned | required | retrieved | history
    text: str
    key: str = ""  # chunk id, event id, layer level...: identity within its kind
    score: float | None = None  # retrieved blocks: the fused retrieval score
    source: str = ""  # the event the text came from: each source is in the prompt once
    time: str = ""  # a turn's time label (turn_labels.py); its header opens a run of this time in the tail
    at: tuple[str, str, int] = ("", "", 0)  # retrieved blocks: chronological order (time, source, chunk)
    stands_for: str = ""  # a compaction summary's line: the event of the turn it stands for
    chunks: tuple[str, ...] = ()  # the chunk ids shown, when not all of `source`'s (a retrieved turn in a line's place)


@dataclass(frozen=True)
class Packed:
    prompt: str
    prefix_bytes: int
    tokens: int
    blocks: tuple[Block, ...]  # included, in prompt order


class BudgetError(InvalidArgument):
    def __init__(self, message: str) -> None:
        super().__init__("token_budget", message, reason="TOKEN_BUDGET_TOO_SMALL")


def _section(kind: str, blocks: Sequence[Block]) -> list[str]:
    parts, shown = [HEADINGS[kind]], ""
    for b in blocks:
        parts.append(f"{header(b.time)}\n{b.text}" if b.time and b.time != shown else b.text)
        shown = b.time
    return parts


def render(blocks: Sequence[Block]) -> tuple[str, int]:
    """The prompt text of `blocks` (already in prompt order) and its prefix bytes."""
    layers = [b.text for b in blocks if b.kind == "layer"]
    pinned = [b.text for b in blocks if b.kind == "pinned"]
    prefix_parts = layers + ([HEADINGS["pinned"], *pinned] if pinned else [])
    prefix = SEPARATOR.join(prefix_parts) + SEPARATOR if prefix_parts else ""
    tail_parts: list[str] = []
    for kind in TAIL_ORDER:
        section = [b for b in blocks if b.kind == kind]
        if section:
            tail_parts += _section(kind, section)
    return prefix + SEPARATOR.join(tail_parts), len(prefix.encode("utf-8"))


def _ordered(blocks: Sequence[Block]) -> list[Block]:
    """Prompt order: layers, pinned and required as given, retrieved oldest first, history as given."""
    order = {"layer": 0, "pinned": 1, "required": 2, "retrieved": 3, "history": 4}
    return sorted(blocks, key=lambda b: (order[b.kind], b.at if b.kind == "retrieved" else ("", "", 0)))


def pack(*, layers: Sequence[Block], pinned: Sequence[Block], required: Sequence[Block],
         retrieved: Sequence[Block], history_newest_first: Sequence[Block], budget: int,
         count: Count, recent_share: float = 0.0) -> Packed:
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
    # A pinned chunk is not retrieved again, nor its turn shown in history; a required turn or
    # memory is neither retrieved (any chunk of it) nor history.
    in_prompt = {b.key for b in chosen}
    required_sources = {b.source for b in chosen if b.kind == "required" and b.source}
    elsewhere = frozenset(b.source for b in chosen if b.source)
    history = [b for b in history_newest_first if b.source not in elsewhere and b.stands_for not in elsewhere]
    times: dict[str, Counter[str]] = {"retrieved": Counter(), "history": Counter()}

    def extra(b: Block, section: Sequence[Block]) -> int:
        """`b`'s estimated cost beside the blocks of its section: its text, the section's heading
        if it opens it, its time header if no block of the section has its time yet."""
        time_cost = cost(header(b.time)) if b.time and not times[b.kind][b.time] else 0
        return cost(b.text) + (0 if section else cost(HEADINGS[b.kind])) + time_cost

    # The newest turn (the one the agent answers; unless it is pinned or required, so shown
    # already), then the reserved recent window.
    recent: list[Block] = []
    newest = history[0] if history and history[0] is history_newest_first[0] else None
    if newest is not None:
        need = count(render(_arranged([*chosen, newest]))[0])
        if need > budget:
            raise BudgetError(f"the newest turn ({newest.key}) needs {need} tokens with the layers, pinned "
                              f"and required items, more than the budget of {budget}; it is never left out")
    reserve, opened_at = int(recent_share * budget), used
    for b in history:
        e = extra(b, recent)
        if b is not newest and (used - opened_at + e > reserve or used + e > budget):
            break
        used += e
        recent.append(b)
        times["history"][b.time] += 1
    reserved = len(recent)
    shown = {b.source for b in recent}
    candidates = [b for b in retrieved
                  if b.key not in in_prompt and b.source not in required_sources and b.source not in shown]
    got: list[Block] = []
    for b in candidates:
        if used + (e := extra(b, got)) <= budget:
            got.append(b)
            used += e
            times["retrieved"][b.time] += 1
    # The longest recent window that fits with the retrieved chunks it reaches moved into it: a
    # turn can cost more than the slack left and still fit once an older turn's chunks move.
    windows: list[tuple[int, int]] = [(reserved, used)]  # (turns of the window, estimated prompt tokens)
    reachable = {b.stands_for or b.source for b in history[reserved:]}
    left = list(got)
    refundable = sum(cost(r.text) for r in left if r.source in reachable) + cost(HEADINGS["retrieved"]) + sum(
        cost(header(t)) for t in {r.time for r in left if r.source in reachable} if t)
    for b in history[reserved:]:
        turn = b.stands_for or b.source  # a summary line's retrieved turn moves in and is shown instead
        moved = [r for r in left if turn and r.source == turn]
        refund = 0
        if moved:  # what the moved chunks cost, their time headers and the heading included
            left = [r for r in left if r not in moved]
            times["retrieved"] = Counter(r.time for r in left)
            refund = sum(cost(r.text) for r in moved) + (0 if left else cost(HEADINGS["retrieved"]))
            refund += sum(cost(header(t)) for t in {r.time for r in moved} if t and not times["retrieved"][t])
        placed = _in_place_of(b, moved) if b.stands_for and moved else b
        used += extra(placed, recent) - refund
        refundable -= refund
        recent.append(b)
        times["history"][placed.time] += 1
        if used <= budget + FILL_TOLERANCE:
            windows.append((len(recent), used))
        elif used - refundable > budget:
            break

    def with_window(n: int) -> list[Block]:
        in_window = {b.source for b in recent[:n]}
        return _arranged([*chosen, *(r for r in got if r.source not in in_window), *reversed(recent[:n])])

    # The longest window whose estimate is within the budget; one just over it is counted for real
    # (the estimate is a token or so over where separators merge), at most WINDOW_RECOUNTS of them.
    recounts, blocks = 0, with_window(reserved)
    for n, estimate in sorted(windows, reverse=True):
        if estimate <= budget:
            blocks = with_window(n)
            break
        if recounts < WINDOW_RECOUNTS:
            recounts += 1
            if count(render(trial := with_window(n))[0]) <= budget:
                blocks = trial
                break
    protected = {newest.key} if newest else set()  # the newest turn is never dropped
    while True:
        prompt, prefix_bytes = render(blocks)
        tokens = count(prompt)
        if tokens <= budget:
            break
        blocks.pop(_to_drop(blocks, reserved, protected, budget, tokens))
    # Estimated costs can miss the real count by a token or so either way where the encoder
    # merges across a boundary: fill what is left in the same priority order, checking the real count.
    return _fill(blocks, prompt, prefix_bytes, tokens, candidates, history, elsewhere, budget, cost, count)


def _to_drop(blocks: list[Block], reserved: int, protected: set[str], budget: int, tokens: int) -> int:
    """Which block goes when the real count is over the budget: the oldest turn beyond the
    reserved window, then the lowest-scored retrieved chunk, then the oldest reserved turn; never
    the newest turn."""
    history = [i for i, b in enumerate(blocks) if b.kind == "history" and b.key not in protected]
    retrieved_at = [i for i, b in enumerate(blocks) if b.kind == "retrieved"]
    if len(history) + len(protected) > reserved:  # turns beyond the reserved window: the oldest of them
        return history[0]
    if retrieved_at:
        return min(retrieved_at, key=lambda i: blocks[i].score or 0.0)
    if history:
        return history[0]
    # cannot happen with a consistent counter; never return over budget
    raise BudgetError(f"the required prompt needs {tokens} tokens, more than the budget of {budget}")


def _arranged(blocks: Sequence[Block]) -> list[Block]:
    """Prompt order, with each summary line whose turn is retrieved replaced by that turn."""
    return _ordered(_lines_give_way(blocks))


VERBATIM = "(verbatim) "


def _in_place_of(line: Block, turn: Sequence[Block]) -> Block:
    """The retrieved chunks of a summary line's turn, as the history block shown in its place: in
    the run of its summary's lines (their time header), marked as said word for word, so it costs
    a few tokens and not two time headers."""
    parts = sorted(turn, key=lambda r: r.at)
    return Block("history", VERBATIM + "\n".join(r.text for r in parts), key=line.key, source=line.stands_for,
                 time=line.time, chunks=tuple(r.key for r in parts))


def _lines_give_way(blocks: Sequence[Block]) -> list[Block]:
    """A summary line whose turn a retrieved chunk of the prompt holds gives its place to the
    turn, shown there as history with the chunks retrieved (once: a second line standing for the
    same turn goes too), so the verbatim turn and its summary are not both spent."""
    retrieved: dict[str, list[Block]] = {}
    for b in blocks:
        if b.kind == "retrieved" and b.source:
            retrieved.setdefault(b.source, []).append(b)
    if not retrieved or not any(b.stands_for in retrieved for b in blocks if b.kind == "history"):
        return list(blocks)
    out: list[Block] = []
    placed: set[str] = set()
    for b in blocks:
        turn = retrieved.get(b.stands_for) if b.kind == "history" and b.stands_for else None
        if turn is None:
            out.append(b)
        elif b.stands_for not in placed:
            placed.add(b.stands_for)
            out.append(_in_place_of(b, turn))
    return [b for b in out if not (b.kind == "retrieved" and b.source in placed)]


def _fill(blocks: list[Block], prompt: str, prefix_bytes: int, tokens: int, candidates: Sequence[Block],
          history_newest_first: Sequence[Block], elsewhere: frozenset[str], budget: int, cost: Count,
          count: Count) -> Packed:
    taken = {(b.kind, b.key) for b in blocks}
    history_sources = {b.source for b in blocks if b.kind == "history" and b.source}
    fill = [b for b in candidates if ("retrieved", b.key) not in taken and b.source not in history_sources]
    # every turn left out is older than those in the prompt (the window stops at its first miss)
    older = [b for b in history_newest_first if ("history", b.key) not in taken and b.source not in elsewhere]
    kinds = {b.kind for b in blocks}
    slack = budget - tokens
    for b in [*fill, *older]:
        line = next((x for x in blocks if x.kind == "history" and x.stands_for and x.stands_for == b.source), None)
        if b.kind == "retrieved" and line is not None:  # it takes its summary line's place: the line is refunded
            estimate = cost(b.text) - cost(line.text)
        else:
            estimate = cost(b.text) + (0 if b.kind in kinds else cost(HEADINGS[b.kind]))
        if estimate > slack + FILL_TOLERANCE:
            if b.kind == "history":
                break
            continue
        if b.kind == "retrieved":
            trial = _arranged([*blocks, b])
        else:  # older than every history block present: it goes first among them, its retrieved chunks move
            rest = [x for x in blocks if x.kind != "history" and not (x.kind == "retrieved" and x.source == b.source)]
            trial = _arranged(rest + [b] + [x for x in blocks if x.kind == "history"])
        trial_prompt, trial_prefix = render(trial)
        trial_tokens = count(trial_prompt)
        if trial_tokens <= budget:
            blocks, prompt, prefix_bytes, tokens = trial, trial_prompt, trial_prefix, trial_tokens
            slack = budget - tokens
            kinds.add(b.kind)
        elif b.kind == "history":
            break
    return Packed(prompt, prefix_bytes, tokens, tuple(blocks))
