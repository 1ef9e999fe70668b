import pytest

from context_engine import clearance
from context_engine.clearance import Action
from context_engine.errors import ClearanceTooLow, InvalidArgument
from context_engine.scope import Scope


def test_scope_levels_and_path():
    s = Scope.parse("acme", "sales", "emea", "bot-7")
    assert s.level == "agent"
    assert s.path == "acme/sales/emea/bot-7"
    assert [a.path for a in s.ancestors()] == ["acme", "acme/sales", "acme/sales/emea", "acme/sales/emea/bot-7"]
    assert Scope.parse("acme").level == "org"
    assert Scope.parse("acme", "sales").level == "pillar"


def test_scope_requires_org():
    with pytest.raises(InvalidArgument) as err:
        Scope.parse("")
    assert err.value.field == "scope.org_id"


@pytest.mark.parametrize("parts, field", [
    (("acme", "", "emea"), "scope.team_id"),
    (("acme", "sales", "", "bot"), "scope.agent_id"),
    (("acme", "", "", "bot"), "scope.agent_id"),
])
def test_scope_rejects_gaps(parts, field):
    with pytest.raises(InvalidArgument) as err:
        Scope.parse(*parts)
    assert err.value.field == field


@pytest.mark.parametrize("bad", ["a b", "x" * 129, "-lead", "a/b", "é"])
def test_scope_rejects_malformed_ids(bad):
    with pytest.raises(InvalidArgument):
        Scope.parse(bad)


def test_is_within_sees_ancestors_not_siblings():
    team = Scope("acme", "sales", "emea")
    assert team.is_within(Scope("acme"))
    assert team.is_within(Scope("acme", "sales"))
    assert not team.is_within(Scope("acme", "sales", "apac"))
    assert not Scope("acme", "sales").is_within(team)


@pytest.mark.parametrize("action, needed", [
    (Action.CREATE_SNAPSHOT, 2), (Action.ROLLBACK, 3), (Action.CREATE_SHARE, 3),
    (Action.CREATE_CROSS_PILLAR_SHARE, 4), (Action.REVOKE_SHARE, 3),
])
def test_clearance_rules(action, needed):
    for level in range(1, 5):
        if level >= needed:
            clearance.require(level, action)
        else:
            with pytest.raises(ClearanceTooLow) as err:
                clearance.require(level, action)
            assert err.value.metadata == {"required": str(needed), "actual": str(level)}


def test_revoke_allowed_for_grant_creator_below_l3():
    clearance.require_revoke(1, caller_subject="alice", grant_creator="alice")
    with pytest.raises(ClearanceTooLow):
        clearance.require_revoke(2, caller_subject="bob", grant_creator="alice")
    clearance.require_revoke(3, caller_subject="bob", grant_creator="alice")
