"""Family LightningModules: methods are configs over these plus a core.

The modules are imported on first use (``from zoo.modules import CausalLMModule``, a config's ``_target_``;
:mod:`zoo.lazy`), so a run loads only the family it trains.
"""

from zoo.lazy import lazy_exports

# public name -> the module of this package that defines it
HOME_MODULES = {
    "CausalLMModule": "causal_lm",
    "EpisodeModule": "episodes",
    "GRPOModule": "grpo",
    "GeneratingModule": "generating",
    "MemEvolveModule": "memevolve",
    "MultiTurnRollout": "multiturn",
    "MultiTurnRolloutModule": "multiturn",
    "PreferenceModule": "preference",
    "SequenceClassifierModule": "sequence_classifier",
    "StructureLMModule": "structure_lm",
    "TestTimeAdaptationModule": "test_time",
    "TextOptModule": "textopt",
    "VaLRModule": "valr",
    "VocabExtendModule": "vocab_extend",
    "ZooBaseModule": "base",
    "ZooModule": "base",
    "exact_answer_match": "causal_lm",
}

__all__ = list(HOME_MODULES)
__getattr__, __dir__ = lazy_exports(__name__, globals(), HOME_MODULES)
