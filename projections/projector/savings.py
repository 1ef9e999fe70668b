"""The baseline calculator: BaselineMetricEvents (metrics:baseline stream) -> savings per org and
model. Idempotent on the stream message id: a redelivered sample is not counted twice."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from projections.store.pool import SYSTEM_ORG, org_transaction


@dataclass(frozen=True)
class Sample:
    message_id: str
    org_id: str
    prompt_id: str
    session_id: str
    model_id: str
    assembled_tokens: int
    naive_tokens: int
    sampled_at: dt.datetime


@dataclass(frozen=True)
class Savings:
    org_id: str
    model_id: str
    samples: int
    assembled_tokens: int
    naive_tokens: int

    @property
    def savings_ratio(self) -> float:
        """Token-weighted: (naive - assembled) / naive over every sample."""
        return (self.naive_tokens - self.assembled_tokens) / self.naive_tokens if self.naive_tokens else 0.0


async def apply_samples(pool: asyncpg.Pool, samples: Sequence[Sample]) -> int:
    """Record new samples and add them to the aggregates; returns how many were new."""
    added = 0
    by_org: dict[str, list[Sample]] = {}
    for s in samples:
        by_org.setdefault(s.org_id, []).append(s)
    for org_id, group in by_org.items():
        async with org_transaction(pool, org_id) as conn:
            fresh = await conn.fetch(
                "INSERT INTO savings_samples (message_id, org_id, prompt_id, session_id, model_id, "
                "  assembled_tokens, naive_tokens, sampled_at) "
                "SELECT u.m, $1, u.p, u.s, u.model, u.a, u.n, u.at FROM unnest($2::uuid[], $3::text[], $4::text[], "
                "  $5::text[], $6::bigint[], $7::bigint[], $8::timestamptz[]) AS u(m, p, s, model, a, n, at) "
                "ON CONFLICT (message_id) DO NOTHING RETURNING model_id, assembled_tokens, naive_tokens",
                org_id, [uuid.UUID(s.message_id) for s in group], [s.prompt_id for s in group],
                [s.session_id for s in group], [s.model_id for s in group],
                [s.assembled_tokens for s in group], [s.naive_tokens for s in group],
                [s.sampled_at for s in group])
            totals: dict[str, list[int]] = {}
            for r in fresh:
                t = totals.setdefault(r["model_id"], [0, 0, 0])
                t[0] += 1
                t[1] += r["assembled_tokens"]
                t[2] += r["naive_tokens"]
            for model_id, (n, assembled, naive) in totals.items():
                await conn.execute(
                    "INSERT INTO savings_by_model "
                    "(org_id, model_id, samples, assembled_tokens, naive_tokens, updated_at) "
                    "VALUES ($1, $2, $3, $4, $5, now()) ON CONFLICT (org_id, model_id) DO UPDATE SET "
                    "samples = savings_by_model.samples + EXCLUDED.samples, "
                    "assembled_tokens = savings_by_model.assembled_tokens + EXCLUDED.assembled_tokens, "
                    "naive_tokens = savings_by_model.naive_tokens + EXCLUDED.naive_tokens, updated_at = now()",
                    org_id, model_id, n, assembled, naive)
            added += len(fresh)
    return added


async def savings(pool: asyncpg.Pool, org_id: str | None = None) -> list[Savings]:
    """Per org and model; every org when `org_id` is None (the `_system` reporting policy)."""
    async with org_transaction(pool, org_id or SYSTEM_ORG, readonly=True) as conn:
        rows = await conn.fetch(
            "SELECT org_id, model_id, samples, assembled_tokens, naive_tokens FROM savings_by_model "
            "WHERE ($1::text IS NULL OR org_id = $1) ORDER BY org_id, model_id", org_id)
    return [Savings(r["org_id"], r["model_id"], r["samples"], r["assembled_tokens"], r["naive_tokens"]) for r in rows]
