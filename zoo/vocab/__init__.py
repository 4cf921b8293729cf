"""Continual vocabulary extension with zero forgetting: token-to-dictionary continual token incorporation.

Paper: "Memory as a Markov Matrix: Sample Efficient Knowledge Expansion via Token-to-Dictionary Mapping"
(arXiv 2605.04308, ICML 2026). The shared seam for every method that adds tokens to a trained model (new words,
special control tokens such as N-MARS's ``<UNDO>``): new rows are separate parameters, so optimiser state, weight
decay and gradient masks can never touch the old rows.

Equation -> function:

- new input rows ``e_j``, old block preserved -> :func:`extend_vocabulary`, :class:`ExtendedEmbedding`
- ``free``: learn ``e_j``, init ``mean_{i in D_j} e_i`` -> :class:`FreeRows`
- ``dictionary``: ``e_j = sum_i softmax(a_j)_i e_{D_j,i}`` -> :class:`DictionaryRows`
- new output rows ``u_j`` (optional) -> :class:`ExtendedOutputHead`; old-context mask -> :func:`mask_new_token_logits`
- new transitions ``P'_j = sum_i w_ji P_{D_j,i}`` (synthetic data) -> :mod:`zoo.data.markov`
- forgetting ``max |delta logit|``, ``KL`` on old-only contexts -> :func:`forgetting_metrics`
- the delta alone (safetensors + token strings) -> :func:`save_delta`, :func:`apply_delta`
- tokenizer additions with contiguous ids -> :func:`register_new_tokens`, :func:`dictionary_token_ids`

Example::

    ext = extend_vocabulary(model, 2, dictionaries=[[17, 42], [5]], mode="dictionary")
    register_new_tokens(tokenizer, ["<zork>", "<blip>"], first_id=ext.first_new_id)
    ext.freeze_base()
    optimizer = torch.optim.AdamW(ext.parameters(), weight_decay=0.01)
    ...
    save_delta(ext, "zork.safetensors", new_tokens=["<zork>", "<blip>"])
    ext.remove()  # the original model, bit for bit
"""

from zoo.vocab.delta import (
    DELTA_FILE,
    Delta,
    apply_delta,
    check_delta_base,
    embedding_fingerprint,
    read_delta,
    save_delta,
)
from zoo.vocab.extension import (
    MODES,
    DictionaryRows,
    ExtendedEmbedding,
    ExtendedOutputHead,
    FreeRows,
    NewRows,
    NewTokenLogitsMask,
    VocabularyExtension,
    extend_vocabulary,
    mask_new_token_logits,
)
from zoo.vocab.forgetting import forgetting_metrics
from zoo.vocab.tokens import dictionary_token_ids, register_new_tokens

__all__ = [
    "DELTA_FILE",
    "MODES",
    "Delta",
    "DictionaryRows",
    "ExtendedEmbedding",
    "ExtendedOutputHead",
    "FreeRows",
    "NewRows",
    "NewTokenLogitsMask",
    "VocabularyExtension",
    "apply_delta",
    "check_delta_base",
    "dictionary_token_ids",
    "embedding_fingerprint",
    "extend_vocabulary",
    "forgetting_metrics",
    "mask_new_token_logits",
    "read_delta",
    "register_new_tokens",
    "save_delta",
]
