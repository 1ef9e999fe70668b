"""The named ways to retrieve, as frozen values: Search's and AssembleContext's retrieval differ by
these fields and by nothing else. The numbers every recipe shares are recipe.py's.

- `permission`: the grant permission that adds a shared chunk to the caller's corpus (`read` for
  Search, `use_in_assembly` for AssembleContext; context_engine/visibility.py);
- `depth`: how many results: the request's `top_k` (`RequestDepth`), or as many as a token budget
  holds at the visible corpus's mean chunk size, half again over (`BudgetDepth`, read from the
  corpus totals on the retrieval's own transaction);
- `generic_plans`: whether the two statements run on generic plans (Search's pools are fixed by
  top_k, so one plan per connection serves them; assembly's depth varies call to call).

A caller copies a recipe with its own budget (`assembly(token_budget)`), never mutates one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from projections.retrieval.outcome import MAX_TOP_K
from projections.retrieval.recipe import MIN_RETRIEVAL_DEPTH, RETRIEVAL_OVERSHOOT, TOKENS_PER_RETRIEVED_CHUNK


@dataclass(frozen=True, slots=True)
class RequestDepth:
    """The request's top_k."""


@dataclass(frozen=True, slots=True)
class BudgetDepth:
    """As many as `token_budget` holds at the visible corpus's mean chunk size, half again over."""

    token_budget: int

    def of(self, corpus_tokens: int, corpus_chunks: int) -> int:
        return retrieval_depth(self.token_budget, corpus_tokens, corpus_chunks)


@dataclass(frozen=True, slots=True)
class RetrievalRecipe:
    name: str
    permission: str
    depth: RequestDepth | BudgetDepth
    generic_plans: bool


#: Search: the request's top_k over what the caller sees and what is shared with it to read.
SEARCH = RetrievalRecipe("search", permission="read", depth=RequestDepth(), generic_plans=True)


def assembly(token_budget: int) -> RetrievalRecipe:
    """AssembleContext's retrieval for a budget: what is shared with the caller for assembly, as
    deep as the budget holds."""
    return RetrievalRecipe("assembly", permission="use_in_assembly", depth=BudgetDepth(token_budget),
                           generic_plans=False)


def retrieval_depth(token_budget: int, corpus_tokens: int, corpus_chunks: int) -> int:
    """How many chunks to retrieve: half again as many as the budget holds at the visible
    corpus's mean chunk size (its token and chunk totals, kept by the projector), so the
    retrieved section, not recency, fills the budget even after the floor removes some, and a
    small budget or a corpus of long chunks does not pay for a deep retrieval it cannot use.
    On LoCoMo (a turn is ~31 cl100k tokens) this is about budget / 20, the fixed rule it
    replaces, which stays the rule when the corpus is empty."""
    if corpus_chunks > 0 and corpus_tokens > 0:
        depth = math.ceil(token_budget * RETRIEVAL_OVERSHOOT * corpus_chunks / corpus_tokens)
    else:
        depth = token_budget // TOKENS_PER_RETRIEVED_CHUNK
    return max(MIN_RETRIEVAL_DEPTH, min(MAX_TOP_K, depth))
