"""QueryVectors: a query's vector is computed once per (org, text), then remembered — least
recently used out first, never shared between orgs, nothing remembered at capacity 0."""

import asyncio

import numpy as np
import pytest

from inference.query_vectors import QueryVectors
from tests.fixtures.embedders import RecordingModel


async def test_the_same_text_in_the_same_org_runs_the_model_once():
    model = RecordingModel()
    vectors = QueryVectors(model, capacity=8)
    first = await vectors.vector("acme", "where is the invoice")
    again = await vectors.vector("acme", "where is the invoice")
    assert model.runs == [["where is the invoice"]]
    assert again.tolist() == first.tolist() == RecordingModel.vector("where is the invoice")
    assert again.dtype == np.float32
    assert vectors.model_version == model.model_version


@pytest.mark.parametrize("capacity, orgs", [
    (8, ("acme", "globex")),  # another org asking the same text gets its own run
    (0, ("acme", "acme")),  # capacity 0 runs the model every time
])
async def test_the_model_runs_again_for_another_org_or_when_nothing_is_remembered(capacity, orgs):
    model = RecordingModel()
    vectors = QueryVectors(model, capacity=capacity)
    for org in orgs:
        await vectors.vector(org, "same words")
    assert model.runs == [["same words"], ["same words"]]


async def test_the_least_recently_used_text_goes_first():
    model = RecordingModel()
    vectors = QueryVectors(model, capacity=2)
    for text in ["a", "b", "a", "c", "a", "b"]:  # "b" is out when "c" comes in; "a" stays
        await vectors.vector("acme", text)
    assert model.runs == [["a"], ["b"], ["c"], ["b"]]


async def test_a_remembered_vector_cannot_be_changed_by_a_caller():
    vectors = QueryVectors(RecordingModel(), capacity=8)
    vector = await vectors.vector("acme", "q")
    with pytest.raises(ValueError):
        vector[0] = 0.0
    assert (await vectors.vector("acme", "q")).tolist() == RecordingModel.vector("q")


async def test_a_failed_run_is_not_remembered():
    model = RecordingModel(fail_on="bad")
    vectors = QueryVectors(model, capacity=8)
    with pytest.raises(RuntimeError):
        await vectors.vector("acme", "bad")
    with pytest.raises(RuntimeError):
        await vectors.vector("acme", "bad")
    assert model.runs == [["bad"], ["bad"]]


def test_a_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        QueryVectors(RecordingModel(), capacity=-1)


async def test_a_remembered_vector_does_not_keep_the_model_run_alive():
    vectors = QueryVectors(RecordingModel(), capacity=8)
    vector = await vectors.vector("acme", "q")
    assert vector.base is None  # its own memory, not a view of the run's (n, dimension) array


async def test_calls_arriving_while_their_text_is_computed_share_that_run():
    model = RecordingModel()
    model.release.clear()
    vectors = QueryVectors(model, capacity=0)  # even with nothing remembered
    calls = [asyncio.create_task(vectors.vector("acme", "same task")) for _ in range(3)]
    other = asyncio.create_task(vectors.vector("globex", "same task"))
    await asyncio.sleep(0)
    model.release.set()
    results = await asyncio.gather(*calls, other)
    assert model.runs == [["same task"], ["same task"]]  # one per org
    assert all(r.tolist() == RecordingModel.vector("same task") for r in results)


async def test_a_caller_giving_up_does_not_cancel_the_run_others_wait_for():
    model = RecordingModel()
    model.release.clear()
    vectors = QueryVectors(model, capacity=8)
    first = asyncio.create_task(vectors.vector("acme", "q"))
    second = asyncio.create_task(vectors.vector("acme", "q"))
    await asyncio.sleep(0)
    first.cancel()
    model.release.set()
    assert (await second).tolist() == RecordingModel.vector("q")
    assert (await vectors.vector("acme", "q")).tolist() == RecordingModel.vector("q")
    assert model.runs == [["q"]]
