"""Who sees what, and who may rewrite it: the one rule every read path and every destructive
command asks (ARCHITECTURE.md section 6, docs/security.md).

Every item — a turn, a memory version, a chunk, a session — is owned by the scope that wrote it
(its `scope_path`), also when it sits in a session owned higher up: a team's turn in an org
session is the team's. A caller sees what is owned at its own scope and at each of its
ancestors' scopes; never a descendant's, a sibling's or another branch's, whatever ids it sends.

A live share grant widens that view by one resource (a chunk, a snapshot or a guardrail layer)
for its grantee scope and every scope below it: a grant to a team holds for its agents. What
the grant lets the grantee do is its permissions: `read` (Search, PullContext of a snapshot)
and `use_in_assembly` (AssembleContext), each on its own. A grantor shares only what it sees by
ownership; what a scope sees through a grant it cannot grant on (projections/reads/share_grants.py).

Reads pass `Visibility.paths` to SQL as `scope_path = ANY($n::text[])`: an equality against a
handful of paths keeps the (org_id, scope_path, ...) indexes in use. Rows already read are
checked with `Visibility.sees`.
"""

from __future__ import annotations

from dataclasses import dataclass

from context_engine.scope import Scope


@dataclass(frozen=True, slots=True)
class Visibility:
    viewer: Scope
    paths: tuple[str, ...]

    @classmethod
    def of(cls, viewer: Scope) -> Visibility:
        return cls(viewer, tuple(s.path for s in viewer.ancestors()))

    def sees(self, owner_path: str) -> bool:
        """Whether an item owned at `owner_path` is visible to the viewer."""
        return owner_path in self.paths

    def holds(self, grantee_path: str) -> bool:
        """Whether a grant to `grantee_path` applies to the viewer: the grantee is its own scope
        or an ancestor's (the same paths, so SQL asks `grantee_path = ANY(sql_paths)`)."""
        return grantee_path in self.paths

    @property
    def sql_paths(self) -> list[str]:
        """The owner paths as a query parameter (asyncpg sends a list as text[])."""
        return list(self.paths)


def may_rewrite(session_owner: Scope, caller: Scope) -> bool:
    """Whether `caller` may change what a session's readers see (RollbackContext; Compact later).

    A session's readers are its owner scope and the scopes below it, and its items are owned
    there too; so only a caller whose subtree holds every reader — the owner scope itself — may
    rewrite it. A caller below the owner would change what its ancestors and siblings see; a
    caller above cannot see the session at all."""
    return caller == session_owner
