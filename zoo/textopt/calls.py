"""Every model call of a textual optimizer goes through :func:`call`: one backend, per-role call and token counts.

Roles: ``forward`` (a component), ``loss`` (an LLM loss), ``backward`` (a TextGrad backward prompt), ``projector``
(TextResNet's semantic projector), ``optimizer`` (a rewrite of a parameter). Backward + projector + optimizer calls
are the token proxy of the TextResNet paper's cost comparison.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from zoo.agents.backends.base import Backend, approx_tokens

ROLES = ("forward", "loss", "backward", "projector", "optimizer")
# the roles whose calls are the token proxy of the paper's cost comparison
PROXY_ROLES = ("backward", "projector", "optimizer")
LOSS_SYSTEM = (
    "You evaluate an output. List what is wrong with it, one item per line; reply with nothing when it is correct."
)


@dataclass
class CallLog:
    """Counts of calls and tokens (prompt + completion, :func:`~zoo.agents.backends.base.approx_tokens`) per role."""

    calls: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)

    def record(self, role: str, prompt: str, reply: str) -> None:
        self.calls[role] += 1
        self.tokens[role] += approx_tokens(prompt) + approx_tokens(reply)

    def proxy_calls(self) -> int:
        """Backward + projector + optimizer calls so far (the token proxy)."""
        return sum(int(self.calls[r]) for r in PROXY_ROLES)

    def snapshot(self) -> dict[str, int]:
        """``calls/<role>`` and ``tokens/<role>`` for every role (zeros included)."""
        out = {f"calls/{r}": int(self.calls[r]) for r in ROLES}
        out.update({f"tokens/{r}": int(self.tokens[r]) for r in ROLES})
        return out


def call(backend: Backend, log: CallLog, role: str, system: str, user: str, seed: int | None = None) -> str:
    """One chat call ``[system, user] -> reply text`` through ``backend``, counted in ``log`` under ``role``."""
    if role not in ROLES:
        raise ValueError(f"call role {role!r}; use one of {ROLES}")
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    reply = backend.complete(messages, seed=seed).content
    log.record(role, system + user, reply)
    return reply


def llm_critique(
    backend: Backend, log: CallLog, evaluation_instruction: str, output: str, seed: int | None = None
) -> list[str]:
    """An LLM loss's critique of ``output`` (TextGrad's ``TextLoss``: ``L = LLM(evaluation_instruction, y)``): one
    ``loss`` call, one critique item per non-empty reply line (none when the evaluator finds nothing wrong)."""
    user = f"{evaluation_instruction}\n<OUTPUT>{output}</OUTPUT>"
    reply = call(backend, log, "loss", LOSS_SYSTEM, user, seed)
    return [line.strip() for line in reply.splitlines() if line.strip()]
