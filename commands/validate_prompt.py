"""ValidatePrompt: does a prompt carry the caller's guardrail layers, unaltered and in order, and
no injection pattern? The layers are those the listed hashes name within the caller's chain,
signed by a key trusted now (projections/reads/guardrail_layers.py); the check itself is pure
(projections/assembly/validation.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from commands.deps import Deps
from context_engine.auth import Principal
from context_engine.errors import InvalidArgument
from context_engine.guardrails.trust import trusted_fingerprints
from projections.assembly import validation as prompt_validation
from projections.reads.guardrail_layers import layers_by_hash
from projections.store.pool import org_transaction


@dataclass(frozen=True)
class ValidatePrompt:
    prompt: str
    layer_hashes: list[str] = field(default_factory=list)  # expected SHA-256 of L1..L4, in order


def validate(cmd: ValidatePrompt, max_bytes: int) -> None:
    if not cmd.prompt:
        raise InvalidArgument("prompt", "must not be empty")
    if len(cmd.prompt.encode()) > max_bytes:
        raise InvalidArgument("prompt", f"is larger than {max_bytes} bytes")


async def validate_prompt(deps: Deps, principal: Principal, cmd: ValidatePrompt) -> prompt_validation.Validation:
    validate(cmd, deps.settings.max_content_bytes)
    scope = principal.scope
    trusted = trusted_fingerprints(deps.settings)  # before a connection is taken
    async with org_transaction(deps.pool, scope.org_id, readonly=True) as conn:
        rows = await layers_by_hash(conn, scope, cmd.layer_hashes, trusted=trusted)
    return prompt_validation.validate_prompt(cmd.prompt, cmd.layer_hashes, {h: r.content for h, r in rows.items()},
                                             levels={h: r.level for h, r in rows.items()})
