"""Rows gathered in memory and written in bulk, as the column arrays of one `unnest` each."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any, Generic, Protocol, TypeVar

import orjson

from projections.store.statement_batch import StatementBatch

R = TypeVar("R", bound="Row")


def columns(rows: Iterable[tuple[Any, ...]], width: int) -> list[list[Any]]:
    cols: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    return cols


def json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class Row(Protocol):
    def values(self) -> tuple[Any, ...]: ...


class PendingRows(Generic[R]):
    """Rows for one INSERT of the form `... SELECT $1 (the org), u.* FROM unnest($2, ...)`."""

    def __init__(self, sql: str, row_type: type[R]) -> None:
        self.sql, self.width = sql, len(fields(row_type))  # type: ignore[arg-type]  # a dataclass of rows
        self.rows: list[tuple[Any, ...]] = []

    def append(self, row: R) -> None:
        self.rows.append(row.values())

    def stage(self, batch: StatementBatch, org_id: str) -> None:
        """Queue the pending rows' INSERT in `batch`, and forget them."""
        if self.rows:
            batch.add(self.sql, org_id, *columns(self.rows, self.width))
            self.rows = []
