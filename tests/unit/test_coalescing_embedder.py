"""CoalescingEmbedder: calls arriving during a model run share the next run; each caller gets
exactly its own vectors; errors and cancellations stay with the calls they belong to."""

import asyncio

import pytest

from inference.coalescing_embedder import CoalescingEmbedder
from tests.fixtures.embedders import RecordingModel


async def test_a_lone_call_runs_at_once_and_alone():
    model = RecordingModel()
    embedder = CoalescingEmbedder(model)
    out = await embedder.embed(["hello"])
    assert model.runs == [["hello"]]
    assert out.tolist() == [RecordingModel.vector("hello")]


async def test_calls_arriving_during_a_run_share_the_next_run_and_get_their_own_vectors():
    model = RecordingModel()
    model.release.clear()
    embedder = CoalescingEmbedder(model)
    first = asyncio.create_task(embedder.embed(["a"]))
    await asyncio.sleep(0)  # the first run starts and blocks in the model
    await asyncio.sleep(0)
    later = [asyncio.create_task(embedder.embed(texts)) for texts in (["bb", "ccc"], ["dddd"], ["e"])]
    await asyncio.sleep(0)
    model.release.set()
    results = await asyncio.gather(first, *later)
    assert model.runs == [["a"], ["bb", "ccc", "dddd", "e"]]
    assert embedder.runs == 2
    expected = [["a"], ["bb", "ccc"], ["dddd"], ["e"]]
    for texts, vectors in zip(expected, results):
        assert vectors.tolist() == [RecordingModel.vector(t) for t in texts]


async def test_a_run_holds_at_most_max_texts_unless_one_call_is_larger():
    model = RecordingModel()
    model.release.clear()
    embedder = CoalescingEmbedder(model, max_texts=3)
    first = asyncio.create_task(embedder.embed(["a"]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    later = [asyncio.create_task(embedder.embed(t)) for t in (["b", "c"], ["d", "e"], ["f", "g", "h", "i"])]
    await asyncio.sleep(0)
    model.release.set()
    await asyncio.gather(first, *later)
    assert model.runs == [["a"], ["b", "c"], ["d", "e"], ["f", "g", "h", "i"]]


async def test_an_error_reaches_every_caller_of_that_run_and_no_other():
    model = RecordingModel(fail_on="bad")
    model.release.clear()
    embedder = CoalescingEmbedder(model, max_texts=2)
    first = asyncio.create_task(embedder.embed(["ok"]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    doomed = [asyncio.create_task(embedder.embed(["bad"])), asyncio.create_task(embedder.embed(["x"]))]
    spared = asyncio.create_task(embedder.embed(["fine"]))
    await asyncio.sleep(0)
    model.release.set()
    assert (await first).tolist() == [RecordingModel.vector("ok")]
    for task in doomed:
        with pytest.raises(RuntimeError, match="model failed"):
            await task
    assert (await spared).tolist() == [RecordingModel.vector("fine")]


async def test_a_cancelled_caller_is_dropped_and_the_others_are_served():
    model = RecordingModel()
    model.release.clear()
    embedder = CoalescingEmbedder(model)
    first = asyncio.create_task(embedder.embed(["a"]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    gone = asyncio.create_task(embedder.embed(["gone"]))
    kept = asyncio.create_task(embedder.embed(["kept"]))
    await asyncio.sleep(0)
    gone.cancel()
    model.release.set()
    assert (await kept).tolist() == [RecordingModel.vector("kept")]
    await first
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert model.runs == [["a"], ["kept"]]
    await embedder.aclose()


async def test_it_is_an_embedder_with_the_inner_identity():
    model = RecordingModel()
    embedder = CoalescingEmbedder(model)
    assert (embedder.model_version, embedder.dimension) == ("recording@1", 2)
    assert embedder.embed_sync(["ab"]).tolist() == [RecordingModel.vector("ab")]
    assert (await embedder.embed([])).shape == (0, 2)
    with pytest.raises(ValueError):
        CoalescingEmbedder(model, max_texts=0)
