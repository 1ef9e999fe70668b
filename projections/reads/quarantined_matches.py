"""The matches a query has among quarantined chunks. Search and AssembleContext never return them
(docs/pii.md), but they say how many there are and why, so that "nothing matches" and "what
matches is held back" read differently: trailing metadata `engine.quarantined_matches` and
`engine.quarantine_reason`, and AssembleContext's fallback_reason when its prompt carries no
retrieved chunk.

A match is lexical (a quarantined chunk has postings but no vector), within the caller's own
visible scopes and the request's domain, counted in items (pushed memory versions), at most
MAX_COUNTED. The count reveals no more than PullContext returns: a quarantined chunk holds the
text as the fallback redacted it. SQL only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

MAX_COUNTED = 1000
RESCAN_HINT = "`context-engine pii rescan` makes them searchable once the PII detector is healthy (docs/pii.md)"


@dataclass(frozen=True)
class Quarantined:
    items: int
    reason: str = ""  # the fallback reason the scan recorded most often among them

    def describe(self) -> str:
        """One sentence for a caller, or "" when nothing is held back. The scan's reason is told as
        its gRPC status alone: the whole text (the sidecar's address, its model directory, a
        multi-line load error) is for operators (`context-engine pii`, the worker's log)."""
        if not self.items:
            return ""
        many = "item" if self.items == 1 else "items"
        more = "+" if self.items >= MAX_COUNTED else ""
        status = _STATUS.search(self.reason)
        why = (f"the PII detector answered {status.group(1)}" if status
               else "the PII detector failed" if self.reason else "no PII detector answered")
        return f"{self.items}{more} matching {many} quarantined by the PII scan ({why}); {RESCAN_HINT}"


_STATUS = re.compile(r"failed with ([A-Z_]{2,40})\b")


_HELD_BACK = """
WITH held AS (
    SELECT DISTINCT c.source_event_id
    FROM chunk_terms t JOIN chunks c ON c.org_id = t.org_id AND c.chunk_id = t.chunk_id
    WHERE t.org_id = $1 AND t.term = ANY($2::text[]) AND NOT t.searchable
      AND t.scope_path = ANY($3::text[]) AND ($4 = '' OR t.domain = $4)
      AND c.active AND c.pii_status = 'quarantined'
    LIMIT $5
)
SELECT (SELECT count(*) FROM held) AS items,
       (SELECT m.pii_fallback_reason FROM memory_versions m JOIN held h ON m.event_id = h.source_event_id
        WHERE m.org_id = $1 AND m.pii_fallback_reason IS NOT NULL
        GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1) AS reason
"""


async def quarantined_matches(conn: asyncpg.Connection, org: str, terms: Sequence[str], scopes: Sequence[str],
                              domain: str) -> Quarantined:
    if not terms:
        return Quarantined(0)
    row = await conn.fetchrow(_HELD_BACK, org, list(dict.fromkeys(terms)), list(scopes), domain, MAX_COUNTED)
    return Quarantined(int(row["items"]), row["reason"] or "")
