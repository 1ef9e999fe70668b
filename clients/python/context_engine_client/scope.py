"""A caller's scope as the engine writes it: `org/pillar/team/agent`, trailing levels left out."""

from __future__ import annotations

from dataclasses import dataclass

from context_engine_client._proto.upsquad.context.v1 import context_pb2 as pb

LEVELS = ("org", "pillar", "team", "agent")


@dataclass(frozen=True)
class Scope:
    org: str
    pillar: str = ""
    team: str = ""
    agent: str = ""

    @classmethod
    def parse(cls, path: "str | Scope") -> "Scope":
        """`acme`, `acme/sales`, `acme/sales/emea` or `acme/sales/emea/bot`."""
        if isinstance(path, Scope):
            return path
        parts = path.split("/")
        if not 1 <= len(parts) <= len(LEVELS) or not all(parts):
            raise ValueError(f"scope {path!r} is not org[/pillar[/team[/agent]]] with no empty level")
        return cls(*parts)

    @property
    def path(self) -> str:
        return "/".join(p for p in (self.org, self.pillar, self.team, self.agent) if p)

    def message(self) -> pb.ScopePath:
        return pb.ScopePath(org_id=self.org, pillar_id=self.pillar, team_id=self.team, agent_id=self.agent)

    def __str__(self) -> str:
        return self.path
