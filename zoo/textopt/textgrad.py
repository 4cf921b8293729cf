"""TextGrad-style textual backpropagation (baseline of TextResNet): LLM-call nodes, a textual loss, hop-by-hop
backward through each node's conversation, and textual gradient descent with ``<IMPROVED_VARIABLE>`` parsing.

Paper: "TextGrad: Automatic 'Differentiation' via Text" (Yuksekgonul et al., arXiv 2406.07496), the baseline of
"TextResNet" (arXiv 2602.08306). Prompts are paraphrases of TextGrad's templates (``llm_ops`` backward "chain"
prompt, ``TextualGradientDescent`` update prompt); their exact wording is a constructor argument.

Equation -> function map (TextGrad's notation):

* forward ``y = LLM(p, x)``                          -> :class:`LLMCall` ``(x) -> y``
* loss ``L = LLM(eval_instruction, y)``              -> :class:`TextLoss`; a critic's items -> :func:`feedback_loss`
* ``dL/dp = LLM(conversation, dL/dy)`` (per input)   -> :meth:`LLMCall.backward` (one call per input that needs a grad)
* ``p <- TGD.step(p, dL/dp)``                        -> :class:`TextualGradientDescent` (``zero_grad``/``step``)
* one optimization step of a chain                   -> :class:`TextGrad` ``.step(examples)``
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from zoo.agents.backends.base import Backend
from zoo.errors import ConfigError
from zoo.textopt.calls import CallLog, call, llm_critique
from zoo.textopt.problem import ChainProblem, Example, StepReport
from zoo.textopt.variable import Variable

BACKWARD_SYSTEM = (
    "You are the backward pass of a textual optimization system. You read one model call (its instruction, input "
    "and output) and the feedback on its output, and you write the feedback that concerns one of the call's "
    "variables. Write only feedback items, one per line; omit items that do not concern the variable."
)
BACKWARD_TEMPLATE = (
    "Component: {component}\nTarget: {target}\nTarget role: {role}\n"
    "<INSTRUCTION>{instruction}</INSTRUCTION>\n<INPUT>{input}</INPUT>\n<OUTPUT>{output}</OUTPUT>\n"
    "Feedback on the output ({output_role}):\n<FEEDBACK>\n{feedback}\n</FEEDBACK>\n"
    "Write the feedback on the {target} of this call."
)
OPTIMIZER_SYSTEM = (
    "You are the optimizer of a textual optimization system. You rewrite a text variable so that it addresses the "
    "feedback it received. Reply with the improved variable between <IMPROVED_VARIABLE> and </IMPROVED_VARIABLE>."
)
OPTIMIZER_TEMPLATE = (
    "Variable role: {role}\n<VARIABLE>{value}</VARIABLE>\nFeedback:\n<FEEDBACK>\n{feedback}\n</FEEDBACK>\n"
    "{constraints}Write the improved variable between <IMPROVED_VARIABLE> and </IMPROVED_VARIABLE>."
)
_IMPROVED = re.compile(r"<IMPROVED_VARIABLE>(.*?)(?:</IMPROVED_VARIABLE>|$)", re.DOTALL)


def parse_improved_variable(reply: str) -> str | None:
    """The text between ``<IMPROVED_VARIABLE>`` and ``</IMPROVED_VARIABLE>`` (an unclosed tag takes the rest).

    Returns ``None`` when the tag is missing or encloses only whitespace (the optimizer then keeps the old value).
    """
    match = _IMPROVED.search(reply)
    if match is None or not match.group(1).strip():
        return None
    return match.group(1).strip()


class LLMCall:
    """A node ``y = LLM(instruction, x)``: the instruction is the system message, ``x`` the user message.

    Args:
        backend: any :class:`zoo.agents.Backend`.
        instruction: the parameter (a :class:`Variable`, usually ``requires_grad=True``).
        log: call counter (roles ``forward`` and ``backward``).
        name: the component id (shown to the backward prompt).
        seed: forwarded to every call.
    """

    def __init__(self, backend: Backend, instruction: Variable, log: CallLog, name: str, seed: int | None = None):
        self.backend = backend
        self.instruction = instruction
        self.log = log
        self.name = name
        self.seed = seed

    def __call__(self, x: Variable, output_role: str) -> Variable:
        reply = call(self.backend, self.log, "forward", self.instruction.value, x.value, self.seed)
        out = Variable(reply, output_role, requires_grad=True, predecessors=[self.instruction, x], name=self.name)
        out.backward_fn = lambda: self.backward(x, out)
        return out

    def backward(self, x: Variable, out: Variable) -> None:
        """Hop-by-hop backward: one LLM call per input that requires a gradient (instruction, then input), each
        reading this call's conversation and the feedback on its output. Nothing happens when the output received
        no feedback."""
        if not out.gradients:
            return
        for target, variable in (("instruction", self.instruction), ("input", x)):
            if not variable.requires_grad:
                continue
            prompt = BACKWARD_TEMPLATE.format(
                component=self.name,
                target=target,
                role=variable.role_description,
                instruction=self.instruction.value,
                input=x.value,
                output=out.value,
                output_role=out.role_description,
                feedback=out.gradient_text(),
            )
            variable.add_gradient(call(self.backend, self.log, "backward", BACKWARD_SYSTEM, prompt, self.seed))


def feedback_loss(output: Variable, critique: Sequence[str]) -> Variable:
    """A loss variable whose value is a critic's feedback; its backward hands the feedback to ``output``."""
    loss = Variable("\n".join(critique), f"feedback on the {output.role_description}", predecessors=[output])
    loss.backward_fn = lambda: [output.add_gradient(item) for item in critique]
    return loss


class TextLoss:
    """An LLM-evaluated loss: ``L = LLM(evaluation_instruction, y)``, one critique item per reply line.

    Args:
        backend: the evaluating model.
        evaluation_instruction: what to check (prepended to the output in the user message).
        log: call counter (role ``loss``).
    """

    def __init__(self, backend: Backend, evaluation_instruction: str, log: CallLog, seed: int | None = None):
        self.backend = backend
        self.evaluation_instruction = evaluation_instruction
        self.log = log
        self.seed = seed

    def critique(self, output: str) -> list[str]:
        """The critique items of ``output`` (:func:`~zoo.textopt.calls.llm_critique`)."""
        return llm_critique(self.backend, self.log, self.evaluation_instruction, output, self.seed)

    def __call__(self, output: Variable) -> Variable:
        return feedback_loss(output, self.critique(output.value))


class TextualGradientDescent:
    """Textual gradient descent: ``zero_grad()`` clears the gradients, ``step()`` rewrites every parameter that holds
    a gradient with one optimizer call and keeps the old value when the reply has no ``<IMPROVED_VARIABLE>``.

    TextGrad's TGD calls the optimizer for every parameter in its list; a parameter with no gradient at all is
    skipped here (its rewrite prompt would carry no feedback). ``parse_failures`` counts replies with no tag.

    Args:
        parameters: the optimized variables.
        backend: the optimizer model.
        log: call counter (role ``optimizer``).
        constraints: lines the rewrite must respect (TextGrad's ``constraints``).
    """

    def __init__(
        self,
        parameters: Sequence[Variable],
        backend: Backend,
        log: CallLog,
        constraints: Sequence[str] = (),
        seed: int | None = None,
    ) -> None:
        self.parameters = list(parameters)
        self.backend = backend
        self.log = log
        self.constraints = list(constraints)
        self.seed = seed
        self.parse_failures = 0

    def zero_grad(self) -> None:
        for parameter in self.parameters:
            parameter.zero_grad()

    def update(self, parameter: Variable) -> bool:
        """Rewrite one parameter from its gradients; ``True`` when its value changed."""
        constraints = "".join(f"Constraint: {c}\n" for c in self.constraints)
        prompt = OPTIMIZER_TEMPLATE.format(
            role=parameter.role_description,
            value=parameter.value,
            feedback=parameter.gradient_text(),
            constraints=constraints,
        )
        new = parse_improved_variable(call(self.backend, self.log, "optimizer", OPTIMIZER_SYSTEM, prompt, self.seed))
        if new is None:
            self.parse_failures += 1
            return False
        changed = new != parameter.value
        parameter.value = new
        return changed

    def step(self) -> list[str]:
        """Update every parameter holding a gradient; returns the names of the parameters sent to the optimizer."""
        updated = []
        for parameter in self.parameters:
            if parameter.gradients:
                self.update(parameter)
                updated.append(parameter.name or parameter.role_description)
        return updated


class ChainOptimizer(ABC):
    """What every textual optimizer of a chain holds: one parameter per component (its instruction), the call log,
    and a :class:`TextualGradientDescent` for the rewrites.

    Args:
        problem: a :class:`~zoo.textopt.problem.ChainProblem`.
        backend: the model of every call.
        seed: forwarded to every call.
        constraints: TGD constraints.
        call_budget: backward + projector + optimizer calls the run may spend (``None``: no cap). A step starts only
            while fewer have been made (:meth:`within_budget`), so the last step may go past it; the steps after it
            are skipped (:class:`~zoo.textopt.run.Tracker`). Equal budgets compare methods at equal cost.
    """

    name = "chain"
    # whether outputs are additive tagged states (TextResNet) or replace-style chain outputs (TextGrad)
    residual = False

    def __init__(
        self,
        problem: ChainProblem,
        backend: Backend,
        seed: int | None = 0,
        constraints: Sequence[str] = (),
        call_budget: int | None = None,
    ) -> None:
        if call_budget is not None and call_budget < 1:
            raise ConfigError(f"call_budget={call_budget}: use null (no cap) or a positive number of calls")
        self.call_budget = call_budget
        self.problem = problem
        self.backend = backend
        self.seed = seed
        self.log = CallLog()
        self.ids = list(problem.component_ids)
        self.parameters = {
            cid: Variable(value, problem.role(cid), requires_grad=True, name=cid)
            for cid, value in zip(self.ids, problem.initial_instructions())
        }
        self.optimizer = TextualGradientDescent(list(self.parameters.values()), backend, self.log, constraints, seed)

    def instructions(self) -> dict[str, str]:
        return {cid: p.value for cid, p in self.parameters.items()}

    def within_budget(self) -> bool:
        """Whether another step may start: no call budget, or fewer proxy calls made than it allows."""
        return self.call_budget is None or self.log.proxy_calls() < self.call_budget

    @abstractmethod
    def output(self, example: Example) -> str:
        """The chain's final output on ``example`` with the current instructions."""

    @abstractmethod
    def step(self, examples: Sequence[Example]) -> StepReport:
        """One optimization step on the minibatch ``examples``."""

    def state(self) -> dict[str, Any]:
        return {"instructions": self.instructions()}

    def load_state(self, state: dict[str, Any]) -> None:
        for cid, value in state["instructions"].items():
            self.parameters[cid].value = value


class TextGrad(ChainOptimizer):
    """TextGrad on a chain problem: replace-style forward ``y_i = LLM(p_i, y_{i-1})``, the problem's critic as the
    loss, hop-by-hop backward, TGD on every parameter that received feedback (arguments: :class:`ChainOptimizer`)."""

    name = "textgrad"

    def __init__(
        self,
        problem: ChainProblem,
        backend: Backend,
        seed: int | None = 0,
        constraints: Sequence[str] = (),
        call_budget: int | None = None,
    ) -> None:
        super().__init__(problem, backend, seed, constraints, call_budget)
        self.nodes = [LLMCall(backend, self.parameters[cid], self.log, cid, seed) for cid in self.ids]

    def forward(self, example: Example) -> Variable:
        y = Variable(example.input, "input of the chain")
        for cid, node in zip(self.ids, self.nodes):
            y = node(y, f"output of component {cid}")
        return y

    def output(self, example: Example) -> str:
        return self.forward(example).value

    def step(self, examples: Sequence[Example]) -> StepReport:
        """One minibatch: forward, critic, backward per example (gradients accumulate in order), then TGD."""
        self.optimizer.zero_grad()
        correct = 0
        for example in examples:
            y = self.forward(example)
            correct += self.problem.is_correct(y.value, example, residual=False)
            critique = self.problem.critique(y.value, example, residual=False, backend=self.backend, log=self.log)
            if critique:
                feedback_loss(y, critique).backward()
        gradients = {cid: list(p.gradients) for cid, p in self.parameters.items()}
        updated = self.optimizer.step()
        return StepReport(correct / max(len(examples), 1), updated, gradients, {})
