"""Textual optimization (plain Python): TextGrad-style backpropagation through text and TextResNet.

* :mod:`zoo.textopt.variable` — :class:`Variable` (value, role description, gradients in insertion order).
* :mod:`zoo.textopt.textgrad` — :class:`LLMCall` nodes through any :class:`zoo.agents.Backend`, :class:`TextLoss`,
  hop-by-hop backward, :class:`TextualGradientDescent` (``zero_grad``/``step``, ``<IMPROVED_VARIABLE>`` parsing) and
  :class:`TextGrad` on a chain (arXiv 2406.07496, the baseline).
* :mod:`zoo.textopt.deltas` — additive tagged deltas (the identity highway).
* :mod:`zoo.textopt.textresnet` — projector, routing, :class:`DensityScheduler`, :class:`TextResNet`
  (arXiv 2602.08306).
* :mod:`zoo.textopt.deepchain` — :class:`DeepChainSim`, the simulator (its docstring lists what its rules build
  in); :mod:`zoo.textopt.problem` — :class:`QAChain`, the real path (JSONL examples, any backend).
* :mod:`zoo.textopt.run` — :func:`optimize` (plain loop) and the :class:`Tracker` the Lightning module uses.

Public API::

    from zoo.textopt import DeepChainSim, optimize
    optimize(DeepChainSim(depth=10, noise=0.1, seed=0), "textresnet", steps=8, batch_size=4)
    # -> {"test_accuracy": ..., "attribution_accuracy": ..., "converged_at": ..., "token_proxy_calls": ..., ...}
"""

from zoo.textopt.calls import CallLog, call
from zoo.textopt.deepchain import DEPTHS, OPERATIONS, DeepChainSim
from zoo.textopt.deltas import (
    append_delta,
    append_retraction,
    is_prefix_chain,
    parse_deltas,
    replace_forward,
    residual_forward,
    visible_deltas,
)
from zoo.textopt.problem import ChainProblem, Example, QAChain, StepReport, read_examples
from zoo.textopt.run import OPTIMIZERS, Tracker, evaluate, make_optimizer, optimize
from zoo.textopt.textgrad import (
    ChainOptimizer,
    LLMCall,
    TextGrad,
    TextLoss,
    TextualGradientDescent,
    parse_improved_variable,
)
from zoo.textopt.textresnet import (
    DensityScheduler,
    LLMProjector,
    Projection,
    RuleProjector,
    TextResNet,
    parse_projection,
)
from zoo.textopt.variable import Variable

__all__ = [
    "DEPTHS",
    "OPERATIONS",
    "OPTIMIZERS",
    "CallLog",
    "ChainOptimizer",
    "ChainProblem",
    "DeepChainSim",
    "DensityScheduler",
    "Example",
    "LLMCall",
    "LLMProjector",
    "Projection",
    "QAChain",
    "RuleProjector",
    "StepReport",
    "TextGrad",
    "TextLoss",
    "TextResNet",
    "TextualGradientDescent",
    "Tracker",
    "Variable",
    "append_delta",
    "append_retraction",
    "call",
    "evaluate",
    "is_prefix_chain",
    "make_optimizer",
    "optimize",
    "parse_deltas",
    "parse_improved_variable",
    "parse_projection",
    "read_examples",
    "replace_forward",
    "residual_forward",
    "visible_deltas",
]
