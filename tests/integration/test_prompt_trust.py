"""The prompt an agent can trust (issue #36), through gRPC with real tokens, the real log, worker
and PostgreSQL: the newest turn is in every prompt; a read that asks for compaction says so; a
compaction that saves too little is refused and every request closes; summary lines are dated as
their turns were said; the gate refuses a summary that states what the turns do not; replaced
turns stay retrievable."""

from __future__ import annotations

import pathlib
import uuid

import grpc
import pytest

from entrypoints.serving.status import error_info
from inference.openai_http import RetryPolicy
from inference.summarizers.chat_completions import ChatCompletionsSummarizer
from projections.reads.session_history import session_history
from projections.retrieval.chunking import chunk_id
from projections.store.pool import org_transaction
from streams.replay import compare, replay
from streams.topics import LogTopics
from tests.fixtures.calls import (
    admin_fetch,
    archived_count,
    expect_error,
    session_version,
    wait_for,
    with_trailers,
)
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import unique
from tests.fixtures.json_server import FakeChatServer
from tests.fixtures.replay import log_of
from tests.fixtures.settling import settled
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

# A renewal negotiation: 14 turns on 28 November, 10 on 3 December; the last is the question.
SAID = [
    ("user", "2026-11-28 09:00", "Hi, Dana Whitfield from Globex here. We want to renew support plan GLX-4471."),
    ("assistant", "2026-11-28 09:02", "Welcome back, Dana. Plan GLX-4471 renews on 15 December 2026 at 12,400 EUR."),
    ("user", "2026-11-28 09:05", "That is more than last year. Can you do 11,000 EUR if we sign for two years?"),
    ("assistant", "2026-11-28 09:07", "For a two-year term I can offer 11,600 EUR a year, with onboarding included."),
    ("user", "2026-11-28 09:10", "We also need 40 seats in Lyon and 12 seats in Porto."),
    ("assistant", "2026-11-28 09:12", "Noted: 40 seats in Lyon and 12 seats in Porto, on invoice 7731."),
    ("user", "2026-11-28 09:15", "Please do not start the rollout on 2026-12-10; our office is closed that week."),
    ("assistant", "2026-11-28 09:16", "Understood, the rollout will not start on 2026-12-10."),
    ("user", "2026-11-28 09:20", "Who is our account manager now?"),
    ("assistant", "2026-11-28 09:21", "Your account manager is Tomas Lindqvist, reachable at tomas@example.com."),
    ("user", "2026-11-28 09:25", "Thanks. Send the draft contract to legal@globex.example please."),
    ("assistant", "2026-11-28 09:26", "Done, the draft contract went to legal@globex.example."),
    ("user", "2026-11-28 09:30", "Great, talk soon."),
    ("assistant", "2026-11-28 09:31", "Have a good weekend, Dana."),
    ("user", "2026-12-03 14:00", "Hello again. Legal approved the two-year term."),
    ("assistant", "2026-12-03 14:01", "Excellent news. Shall I prepare the final order form?"),
    ("user", "2026-12-03 14:03", "Yes, but we want the onboarding workshop in January."),
    ("assistant", "2026-12-03 14:04", "The onboarding workshop can be on 12 January 2027 in Lyon."),
    ("user", "2026-12-03 14:06", "Perfect. Is the price still what you offered?"),
    ("assistant", "2026-12-03 14:07", "Yes, the same yearly price for the two years."),
    ("user", "2026-12-03 14:09", "And the payment terms?"),
    ("assistant", "2026-12-03 14:10", "Net 30 days from the invoice date."),
    ("user", "2026-12-03 14:12", "Fine. One more question before I sign."),
    ("user", "2026-12-03 14:15", "Remind me how much we save each year against the list price?"),
]
# Small talk the summary drops, so compacting the first 14 turns saves a fifth of the session.
SMALL_TALK = ("Sounds good to me, thanks!", "Okay, great, thank you so much.", "Yes, that is fine with me.",
              "Sure, no problem at all.")
NEGOTIATION = [(role, at, f"{text} {SMALL_TALK[i % 4]}" if i < 14 else text) for i, (role, at, text) in enumerate(SAID)]
NEWEST = f"user: {NEGOTIATION[-1][2]}"
OLD_TOPICS = "account manager Tomas Lindqvist email, draft contract to legal, seats in Lyon and Porto on invoice"
KEEP = 10  # the deployment's COMPACTION_KEEP_RECENT_TURNS


async def negotiation(engine, turns=NEGOTIATION):
    """The conversation in a session owned by team sales/emea; its owner (clearance 3) and event ids."""
    org, sid = unique("org"), unique("deal")
    owner = engine.caller(org, "sales", "emea", clearance=3)
    ids = []
    for role, time_, text in turns:
        reply = await owner.durably("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message",
                                                                 content=text.encode(),
                                                                 metadata={"role": role, "time": time_}))
        ids.append(reply.event_id)
    return org, sid, owner, ids


def assemble(sid: str, budget: int, task: str = OLD_TOPICS, **hints: str) -> pb.AssembleContextRequest:
    return pb.AssembleContextRequest(session_id=sid, task_description=task, token_budget=budget, model_id="gpt-4",
                                     hints=hints)


async def requests(engine, org, sid):
    return await admin_fetch(engine, "SELECT opened_by::text AS opened_by, closed_reason, refusal, closed_version "
                                     "FROM compaction_requests WHERE org_id = $1 AND session_id = $2 "
                                     "ORDER BY opened_at", org, sid)


async def compact(lead, sid):
    return await lead("Compact", pb.CompactRequest(session_id=sid, strategy="sliding_window"))


async def compact_with_llm(engine, lead, sid, answer: str):
    """Compact with an LLM summarizer served by a local fake answering `answer`."""
    with FakeChatServer() as llm:
        llm.answer = answer
        default, engine.deps.summarizer = engine.deps.summarizer, ChatCompletionsSummarizer(
            base_url=llm.base_url, model="gemini-2.5-flash-lite", retry=RetryPolicy(1))
        try:
            return await compact(lead, sid)
        finally:
            engine.deps.summarizer = default


def llm_record(lines: dict[int, str]) -> str:
    """An LLM's record: each kept turn's line, numbered as the transcript numbers the turns."""
    return "\n".join(f"[{i}] {SAID[i][0]}: {text}" for i, text in lines.items())


# The 14 turns a Compact replaces, as an honest LLM would summarise them.
HONEST = {i: SAID[i][2] for i in range(14) if i not in (8, 12, 13)}


# -- 1. the newest turn ----------------------------------------------------------------------------

async def test_the_newest_turn_ends_every_prompt_however_much_retrieval_could_take(engine):
    org, sid, owner, ids = await negotiation(engine)
    agent = engine.caller(org, "sales", "emea", "closer", clearance=2)  # reads the team's session, never compacts it
    await settled(engine.settings.database_url, org)
    newest_chunk = str(chunk_id(ids[-1], 0))
    for budget in (40, 120, 200, 400, 800):
        reply = await agent("AssembleContext", assemble(sid, budget))
        prompt = reply.assembled_prompt
        assert "## Recent conversation" in prompt and prompt.rstrip().endswith(NEWEST), (budget, prompt)
        assert reply.assembled_tokens <= budget and newest_chunk in reply.chunk_ids
    # At 400 tokens retrieval still has its share: the old turns the task is about are in it.
    reply = await agent("AssembleContext", assemble(sid, 400))
    assert "Tomas Lindqvist" in reply.assembled_prompt and "## Retrieved context" in reply.assembled_prompt
    err = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, agent("AssembleContext", assemble(sid, 12)),
                             reason="TOKEN_BUDGET_TOO_SMALL")
    assert error_info(err).metadata["field"] == "token_budget" and f"newest turn ({ids[-1]})" in err.details()


async def test_a_call_may_move_the_recent_window_and_bad_shares_are_refused(engine):
    org, sid, owner, ids = await negotiation(engine)
    agent = engine.caller(org, "sales", "emea", "closer", clearance=2)
    await settled(engine.settings.database_url, org)

    async def recent_turns(share: str, budget: int = 250) -> int:
        prompt = (await agent("AssembleContext", assemble(sid, budget, recent_share=share))).assembled_prompt
        recent = prompt.split("## Recent conversation", 1)[1]
        return sum(line.startswith(("user: ", "assistant: ")) for line in recent.splitlines())

    assert 1 == await recent_turns("0") <= await recent_turns("0.3") < await recent_turns("0.6") \
        < await recent_turns("1")
    for bad in ("", "abc", "-0.1", "1.5", "nan", "inf", "0x1", "\x00", "1" * 5000):
        err = await expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                                 agent("AssembleContext", assemble(sid, 600, recent_share=bad)))
        assert error_info(err).metadata["field"] == "hints.recent_share", bad


# -- 2. a read that asks for compaction says so ------------------------------------------------------

async def test_an_assembly_that_asks_for_compaction_names_the_request_and_no_refused_request_stays_open(engine):
    org, sid, owner, ids = await negotiation(engine)
    reply, trailers = await with_trailers(owner, "AssembleContext", assemble(sid, 400))
    request_id = trailers["engine.compaction_requested"]
    assert [r["opened_by"] for r in await requests(engine, org, sid)] == [request_id]

    async def compacted():
        rows = await admin_fetch(engine, "SELECT replaced_turns FROM compactions WHERE org_id = $1 AND "
                                         "session_id = $2", org, sid)
        return rows

    [done] = await wait_for("the worker's compaction", compacted, engine)
    assert done["replaced_turns"] == len(NEGOTIATION) - KEEP
    # Still over the threshold, with nothing left to compact: the next crossing opens a request the
    # worker refuses, closing it with its reason; then no request is opened for this version.
    _, trailers = await with_trailers(owner, "AssembleContext", assemble(sid, 400))
    second = trailers.get("engine.compaction_requested")
    assert second and second != request_id

    async def refused():
        rows = await requests(engine, org, sid)
        return rows if rows[-1]["closed_reason"] == "refused" else None

    rows = await wait_for("the refusal", refused, engine)
    assert rows[-1]["refusal"] == "nothing_to_compact"
    assert rows[-1]["closed_version"] == await session_version(engine, org, sid)
    assert all(r["closed_reason"] for r in rows)  # none stays open
    events = await archived_count(engine, org)
    _, trailers = await with_trailers(owner, "AssembleContext", assemble(sid, 400))
    assert "engine.compaction_requested" not in trailers and await archived_count(engine, org) == events
    rc, out = await engine.cli("stats", "compaction", "--org", org)
    assert rc == 0 and org in out, out


# -- 3. no rewrite for nothing -----------------------------------------------------------------------

async def test_a_compaction_that_saves_too_little_is_refused_and_writes_nothing(engine):
    org, sid, owner, ids = await negotiation(engine)
    await compact(owner, sid)
    for role, time_, text in NEGOTIATION[-3:]:
        await owner("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message", content=text.encode(),
                                                         metadata={"role": role, "time": time_}))
    version, events = await session_version(engine, org, sid), await archived_count(engine, org)
    err = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, compact(owner, sid), reason="INSUFFICIENT_SAVINGS")
    details = error_info(err).metadata
    assert int(details["original_tokens"]) - int(details["compacted_tokens"]) < 0.1 * int(details["session_tokens"])
    # An LLM summary longer than what it replaces is refused the same way.
    fresh_org, fresh, lead, _ = await negotiation(engine)
    verbose = llm_record({i: NEGOTIATION[i][2] + " " + SAID[i][2] for i in range(14)})
    await expect_error(grpc.StatusCode.FAILED_PRECONDITION, compact_with_llm(engine, lead, fresh, verbose),
                       reason="INSUFFICIENT_SAVINGS")
    assert await session_version(engine, org, sid) == version and await archived_count(engine, org) == events


async def test_two_compactions_of_one_state_have_their_own_versions_and_one_is_current(engine):
    org, sid, owner, ids = await negotiation(engine)
    base = await session_version(engine, org, sid)
    first = await compact(owner, sid)
    await owner("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=base))
    second = await compact(owner, sid)
    assert first.version_hash != second.version_hash
    assert (first.original_tokens, first.compacted_tokens) == (second.original_tokens, second.compacted_tokens)
    async with org_transaction(engine.deps.pool, org, readonly=True) as conn:
        history = await session_history(conn, org, sid)
    assert history is not None
    current = [item for item in history if item.current]
    assert len(current) == 1 and current[0].version == second.version_hash and current[0].kind == "compaction"


# -- 4. every line dated as it was said --------------------------------------------------------------

async def test_summary_lines_are_dated_and_placed_as_their_turns_were_said(engine):
    org, sid, owner, ids = await negotiation(engine, NEGOTIATION[:7])
    bot = engine.caller(org, "sales", "emea", "bot", clearance=2)
    await bot("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message",
                                                   content=b"Reminder: check the Lyon office calendar.",
                                                   metadata={"role": "bot", "time": "2026-11-28 09:15"}))
    for role, time_, text in NEGOTIATION[7:]:
        await owner("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message", content=text.encode(),
                                                         metadata={"role": role, "time": time_}))
    await compact(owner, sid)
    # The bot below the team sees the team's summary lines and its own turn, in the order said.
    prompt = (await bot("AssembleContext", assemble(sid, 4000, task=""))).assembled_prompt
    recent = prompt.split("## Recent conversation", 1)[1]
    headers = [line[1:-1] for line in recent.splitlines() if line.startswith("[")]
    times = [h.split(",")[0] for h in headers]
    assert times == sorted(times), headers
    assert "2026-11-28 09:02, summary of earlier turns" in headers
    assert recent.index("Plan GLX-4471 renews") < recent.index("Reminder: check the Lyon office") \
        < recent.index("rollout will not start on 2026-12-10")
    assert recent.index("rollout will not start") < recent.index("[2026-12-03 14:00]")
    # A required summary line says what it is too.
    line = (await admin_fetch(engine, "SELECT event_id FROM session_events WHERE org_id = $1 AND session_id = $2 AND "
                                      "summary_of IS NOT NULL ORDER BY seq LIMIT 1", org, sid))[0]["event_id"]
    required = (await owner("AssembleContext", assemble(sid, 4000, task="", must_include=f"event:{line}")))
    section = required.assembled_prompt.split("## Required context", 1)[1].split("##", 1)[0]
    assert "[2026-11-28 09:00, summary of earlier turns]" in section


# -- 5. a gate that means what it says ---------------------------------------------------------------

async def test_a_session_of_decimals_and_currencies_compacts(engine):
    turns = [(role, at, f"{text} {SMALL_TALK[i]} {SMALL_TALK[(i + 1) % 4]}") for i, (role, at, text) in enumerate((
        ("user", "2026-11-21 10:00", "The parcel weighs 30.5 kg and costs $30.50 to ship."),
        ("assistant", "2026-11-21 10:01", "The second parcel is 12.25 kg, €4.99 for insurance."),
        ("user", "2026-11-22 10:02", "Total 1,200.50 EUR, 12.5 % above the quote."),
        ("assistant", "2026-11-22 10:03", "Delivery takes 3.5 hours from Porto.")))] + NEGOTIATION[-KEEP:]
    org, sid, owner, _ = await negotiation(engine, turns)
    reply = await compact(owner, sid)
    assert reply.fact_retention_score == 1.0 and reply.compacted_tokens < reply.original_tokens


@pytest.mark.parametrize(("change", "shows"), [
    ((5, "Noted: 40 seats in Lyon and 12 seats in Porto, on invoice 7732."), "7732"),  # a changed number
    ((4, "We also need 12 seats in Lyon and 40 seats in Porto."), "lyon"),  # two allocations swapped
    ((7, "Understood, the rollout will start on 2026-12-10."), "2026-12-10"),  # a negation dropped
], ids=["changed-number", "swapped", "negation-dropped"])
async def test_a_summary_that_states_what_the_turns_do_not_is_refused(engine, change, shows):
    org, sid, owner, _ = await negotiation(engine)
    version, events = await session_version(engine, org, sid), await archived_count(engine, org)
    turn, text = change
    err = await expect_error(grpc.StatusCode.FAILED_PRECONDITION,
                             compact_with_llm(engine, owner, sid, llm_record(HONEST | {turn: text})),
                             reason="QUALITY_GUARDRAIL_TRIGGERED")
    assert shows in error_info(err).metadata["introduced"].lower(), error_info(err).metadata
    assert await session_version(engine, org, sid) == version and await archived_count(engine, org) == events
    assert (await compact_with_llm(engine, owner, sid, llm_record(HONEST))).fact_retention_score >= 0.98


async def test_a_summary_that_keeps_a_corrected_statement_without_its_correction_is_refused(engine):
    correction = ("user", "2026-11-28 09:13", "Correction: 12 seats in Lyon and 40 seats in Porto.")
    said = [*SAID[:6], correction, *SAID[6:]]
    turns = [*NEGOTIATION[:6], correction, *NEGOTIATION[6:]]
    org, sid, owner, _ = await negotiation(engine, turns)
    stale = {i: text for i, (_, _, text) in enumerate(said[:15]) if i not in (6, 9, 13, 14)}  # no correction
    err = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, compact_with_llm(
        engine, owner, sid, "\n".join(f"[{i}] {said[i][0]}: {t}" for i, t in stale.items())),
        reason="QUALITY_GUARDRAIL_TRIGGERED")
    assert error_info(err).metadata["superseded"], error_info(err).metadata
    assert (await compact(owner, sid)).fact_retention_score >= 0.98  # the offline summary keeps the correction
    line = await admin_fetch(engine, "SELECT content FROM session_events WHERE org_id = $1 AND session_id = $2 AND "
                                     "active AND content LIKE '%Correction%'", org, sid)
    assert line


# -- 6. compaction keeps evidence reachable -----------------------------------------------------------

async def test_replaced_turns_stay_retrievable_under_every_rule_and_replay_agrees(engine):
    org, sid, owner, ids = await negotiation(engine)
    manager, manager_chunk = SAID[9][2], str(chunk_id(ids[9], 0))
    base = await session_version(engine, org, sid)
    await compact(owner, sid)
    await settled(engine.settings.database_url, org)
    found = await owner("Search", pb.SearchRequest(query="account manager Tomas Lindqvist", top_k=3))
    assert found.results and found.results[0].chunk_id == manager_chunk
    assert found.results[0].content == f"assistant: {manager}" or manager in found.results[0].content
    # In the prompt the turn stands in its summary line's place, once; its chunk is the one listed.
    reply = await owner("AssembleContext", assemble(sid, 4000, task="who is our account manager?"))
    assert reply.assembled_prompt.count("Tomas Lindqvist") == 1 and manager in reply.assembled_prompt
    assert manager_chunk in reply.chunk_ids
    # A pinned replaced turn keeps resolving, and its line is not shown beside it.
    pinned = await owner("AssembleContext", assemble(sid, 4000, task="", pinned_chunk_ids=manager_chunk))
    assert pinned.assembled_prompt.count("Tomas Lindqvist") == 1
    assert pinned.assembled_prompt.index("Tomas Lindqvist") < pinned.cache_prefix_bytes
    required = await owner("AssembleContext", assemble(sid, 4000, task="", must_include=f"event:{ids[9]}"))
    section = required.assembled_prompt.split("## Required context", 1)[1].split("## Recent conversation")
    assert manager in section[0] and "Tomas Lindqvist" not in section[1]
    # Another team does not find it; a rollback to before the turn was said removes it.
    sibling = engine.caller(org, "sales", "apac", clearance=4)
    assert not [r for r in (await sibling("Search", pb.SearchRequest(query="Tomas Lindqvist", top_k=10))).results
                if r.chunk_id == manager_chunk]
    before_turn = (await admin_fetch(engine, "SELECT version FROM session_items WHERE org_id = $1 AND event_id = $2",
                                     org, uuid.UUID(ids[8])))[0]["version"]
    await owner("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=before_turn))
    assert not [r for r in (await owner("Search", pb.SearchRequest(query="Tomas Lindqvist", top_k=10))).results
                if r.chunk_id == manager_chunk]
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       owner("AssembleContext", assemble(sid, 4000, task="", pinned_chunk_ids=manager_chunk)))
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       owner("AssembleContext", assemble(sid, 4000, task="", must_include=f"event:{ids[9]}")))
    await owner("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=base))
    assert (await owner("Search", pb.SearchRequest(query="Tomas Lindqvist", top_k=3))).results[0].chunk_id == \
        manager_chunk
    # Replay rebuilds the same read models from the log.
    await settled(engine.settings.database_url, org)
    topic = LogTopics.from_settings(engine.settings).events
    async with fresh_database(engine.settings.database_url, "ce_test_replay") as target:
        await replay(log_of(engine.settings, topic), target)
        assert await compare(engine.settings.database_url, target) == []


# -- the prompts docs/compaction.md shows -------------------------------------------------------------

DOC_TURNS = [
    ("user", "2026-11-28 09:00", "Hi there! Great, thank you so much. We want to renew support plan GLX-4471 "
                                 "for Globex. Thanks!"),
    ("assistant", "2026-11-28 09:02", "Hello Dana! Sounds good, no problem at all. Plan GLX-4471 renews on "
                                      "15 December 2026 at 12,400 EUR. Okay?"),
    ("user", "2026-11-28 09:05", "Okay, great. We need 40 seats in Lyon and 12 seats in Porto. Thanks a lot!"),
    ("assistant", "2026-11-28 09:07", "Sure, no problem. Noted: 40 seats in Lyon and 12 seats in Porto. "
                                      "Have a great day!"),
    ("user", "2026-12-03 14:00", "Hello again. Legal approved the two-year term."),
    ("assistant", "2026-12-03 14:01", "Shall I prepare the order form?"),
    ("user", "2026-12-03 14:03", "Yes, with the workshop in January."),
    ("assistant", "2026-12-03 14:04", "The workshop can be on 12 January 2027 in Lyon."),
    ("user", "2026-12-03 14:06", "Is the price unchanged?"),
    ("assistant", "2026-12-03 14:07", "Yes, the same yearly price."),
    ("user", "2026-12-03 14:09", "And the payment terms?"),
    ("assistant", "2026-12-03 14:10", "Net 30 days."),
    ("user", "2026-12-03 14:12", "Fine."),
    ("user", "2026-12-03 14:15", "How many seats did we ask for in Porto?"),
]


def documented(name: str) -> str:
    """The ```text block after `<!-- name -->` in docs/compaction.md."""
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "compaction.md").read_text()
    return doc.split(f"<!-- {name} -->", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0]


async def test_the_prompts_docs_show_before_and_after_a_compaction_are_the_engines(engine):
    """History only (no task_description: nothing depends on the embedder), the whole session in
    the budget: the same turns before, the summary lines in the older turns' places after."""
    org, sid, owner, _ = await negotiation(engine, DOC_TURNS)
    request = pb.AssembleContextRequest(session_id=sid, token_budget=2000, model_id="gpt-4")
    before = (await owner("AssembleContext", request)).assembled_prompt
    compacted = await compact(owner, sid)
    assert (compacted.original_tokens, compacted.compacted_tokens) == (109, 77)
    after = (await owner("AssembleContext", request)).assembled_prompt
    assert before == documented("prompt before compaction")
    assert after == documented("prompt after compaction")
