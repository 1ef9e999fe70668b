"""Several data-modifying statements sent as one: each becomes a WITH clause of a single query.

A projector batch writes a dozen tables. As separate statements that is a dozen round trips,
and under load each costs ~0.7 ms on this project's 2-core machines (the worker waits for the
PostgreSQL backend to be scheduled, and back), more than the statements' own work. PostgreSQL
runs every data-modifying WITH clause exactly once and to completion whether or not the query
reads its output, all on one snapshot: so the statements must touch different rows (here:
different tables, or the same table's rows at most once).

Each statement is written with its own $1, $2, ...; `add` renumbers them after those added
before. Placeholders never appear inside a literal in this project's SQL.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg

_PLACEHOLDER = re.compile(r"\$(\d+)")
NOTHING = "SELECT WHERE false"  # the query proper when no clause's rows are read


def _shifted(sql: str, offset: int) -> str:
    return _PLACEHOLDER.sub(lambda m: f"${int(m[1]) + offset}", sql)


class StatementBatch:
    def __init__(self) -> None:
        self._clauses: list[str] = []
        self._args: list[Any] = []

    def add(self, sql: str, *args: Any) -> str:
        """Queue a statement; returns the name of its WITH clause (to read its RETURNING rows)."""
        name = f"w{len(self._clauses)}"
        self._clauses.append(f"{name} AS ({_shifted(sql.strip(), len(self._args))})")
        self._args.extend(args)
        return name

    async def run(self, conn: asyncpg.Connection, select: str = NOTHING, *args: Any) -> list[asyncpg.Record]:
        """Run every queued statement in one round trip. `select` is the query proper, with its
        own placeholders for `args`: it reads the clauses' RETURNING rows (e.g. "SELECT chunk_id
        FROM w3"), or does what a WITH clause cannot (a SELECT clause runs only if read); by
        default nothing."""
        if not self._clauses and select == NOTHING:
            return []
        query = _shifted(select, len(self._args))
        if self._clauses:
            query = "WITH " + ",\n".join(self._clauses) + "\n" + query
        return await conn.fetch(query, *self._args, *args)
