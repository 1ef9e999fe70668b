"""The text analyzer: the search terms of a text, as the lexical index stores them and a query
looks them up (projections/retrieval/bm25.py), and as the compaction summarizer counts what a
sentence brings (inference/summarizers/extractive.py). Pure, no I/O.

1. Unicode NFKC normalisation, then ``str.casefold()`` (full Unicode lower-casing:
   ``"Straße"`` -> ``"strasse"``).
2. Tokens are maximal runs of Unicode letters and digits (``[^\\W_]+``); everything else,
   including ``_`` and apostrophes, separates tokens (``"don't"`` -> ``don``, ``t``; the
   fragments are stop words). Han ideographs, Hiragana and Katakana are emitted one character
   per token (no dictionary segmentation for those scripts; this is what Lucene's
   StandardTokenizer does for ideographs).
3. Tokens in :data:`STOP_WORDS` (a modest English function-word list, written out below)
   are dropped. No stemming: nothing here shows it would help, and an unstemmed index keeps
   the tf rows exact and debuggable. Document length is counted AFTER stop-word removal.
4. A token longer than :data:`MAX_TERM_CHARS` keeps its first that many characters (as
   Lucene caps a token's length): a hash or a blob without spaces must not make a posting
   larger than PostgreSQL's index rows allow (about 2.7 KB).
"""

from __future__ import annotations

import re
import unicodedata

MAX_TERM_CHARS = 128  # at most 4 bytes each in UTF-8: 512 bytes, well inside an index row

#: English function words removed by the analyzer. Articles, pronouns, auxiliaries,
#: common prepositions and conjunctions, and the fragments contractions split into.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a an the
    and or but nor so yet if then than because while as
    of to in on at by for with from into onto about over under up down out off
    i me my mine myself we us our ours ourselves you your yours yourself yourselves
    he him his himself she her hers herself it its itself they them their theirs themselves
    this that these those there here
    is am are was were be been being
    do does did doing done
    have has had having
    will would shall should can could may might must
    what which who whom whose when where why how
    not no
    all any both each few more most other some such only own same too very just also
    s t d ll m re ve don doesn didn isn aren wasn weren haven hasn hadn couldn shouldn wouldn
    """.split()
)

_TOKEN = re.compile(
    r"[\u3040-\u309f\u30a0-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"  # one per token
    r"|[^\W_\u3040-\u309f\u30a0-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+"
)


def analyze(text: str) -> list[str]:
    """The analysed terms of ``text``, in order (see the module docstring)."""
    if not text:
        return []
    norm = unicodedata.normalize("NFKC", text).casefold()
    return [t[:MAX_TERM_CHARS] for t in _TOKEN.findall(norm) if t not in STOP_WORDS]
