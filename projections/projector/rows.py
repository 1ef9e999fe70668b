"""Rows gathered in memory and written in bulk, as the column arrays of one `unnest` each."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from projections.store.statement_batch import StatementBatch


def columns(rows: Iterable[tuple[Any, ...]], width: int) -> list[list[Any]]:
    cols: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    return cols


def json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class PendingRows:
    """Rows for one INSERT of the form `... SELECT $1 (the org), u.* FROM unnest($2, ...)`."""

    def __init__(self, sql: str, width: int) -> None:
        self.sql, self.width = sql, width
        self.rows: list[tuple[Any, ...]] = []

    def append(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)

    def stage(self, batch: StatementBatch, org_id: str) -> None:
        """Queue the pending rows' INSERT in `batch`, and forget them."""
        if self.rows:
            batch.add(self.sql, org_id, *columns(self.rows, self.width))
            self.rows = []
