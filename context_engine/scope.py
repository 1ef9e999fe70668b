"""ScopePath: a caller's place in the hierarchy Org > Pillar > Team > Agent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from context_engine import validation
from context_engine.errors import InvalidArgument

Level = Literal["org", "pillar", "team", "agent"]
LEVELS: tuple[Level, ...] = ("org", "pillar", "team", "agent")

# Ids travel in keys, topic keys and log lines; keep them printable and bounded. The rule lives
# in context_engine.validation (`identifier`); the name stays for the code that imports it here.
ID_PATTERN = validation.ID_PATTERN


@dataclass(frozen=True, slots=True)
class Scope:
    org_id: str
    pillar_id: str = ""
    team_id: str = ""
    agent_id: str = ""

    @classmethod
    def parse(cls, org_id: str, pillar_id: str = "", team_id: str = "", agent_id: str = "",
              *, field: str = "scope") -> Scope:
        """Validate ids and the no-gap rule: a level is set only when every ancestor is."""
        parts = {"org_id": org_id, "pillar_id": pillar_id, "team_id": team_id, "agent_id": agent_id}
        if not org_id:
            raise InvalidArgument(f"{field}.org_id", "is required")
        seen_empty = None
        for name, value in parts.items():
            if not value:
                seen_empty = seen_empty or name
                continue
            if seen_empty:
                raise InvalidArgument(f"{field}.{name}", f"is set while {field}.{seen_empty} is empty")
            validation.identifier(value, f"{field}.{name}")
        return cls(org_id, pillar_id, team_id, agent_id)

    @property
    def level(self) -> Level:
        if self.agent_id:
            return "agent"
        if self.team_id:
            return "team"
        if self.pillar_id:
            return "pillar"
        return "org"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i for i in (self.org_id, self.pillar_id, self.team_id, self.agent_id) if i)

    @property
    def path(self) -> str:
        """Stable textual form, e.g. 'acme/sales/emea/bot-7'; the unit of ownership in read models."""
        return "/".join(self.ids)

    @classmethod
    def from_path(cls, path: str) -> Scope:
        """The scope of a `path` the engine stored (a read model's scope_path): not validated again."""
        return cls(*path.split("/"))

    def ancestors(self) -> list[Scope]:
        """Own scope and every ancestor, root first: what this caller may see by ownership."""
        ids = self.ids
        return [Scope(*ids[: n + 1]) for n in range(len(ids))]

    def is_within(self, other: Scope) -> bool:
        """True when self is other or a descendant of other."""
        return self.ids[: len(other.ids)] == other.ids
