"""The anchors of decoding comparisons on the decoder seam (the DTS demo's arms): greedy (``module/decoder=greedy``)
and self-consistency (``module/decoder=self_consistency``, zoo.generation.voting), plus the shared majority vote."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hydra.utils import instantiate

from zoo.answers import AnswerVerifier
from zoo.backbones import TinyBackbone
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.generation import GreedyDecoder, SampleDecoder, SelfConsistencyDecoder, majority_vote
from zoo.protocols import SamplingParams

torch.set_num_threads(1)
PROMPTS = ["1+1=", "22+3=", "rev ab=", "9+9="]


class FirstCharacter(AnswerVerifier):
    """A verifier whose answer is the first character of a completion (so random completions vote)."""

    def extract_answer(self, completion: str) -> str | None:
        return completion[:1] or None


@pytest.fixture(scope="module")
def tiny():
    backbone = TinyBackbone(seed=2)
    model, tok = backbone.build_model().eval(), backbone.tokenizer
    with torch.no_grad():  # EOS about as likely as a frequent character: samples of different lengths
        head = model.get_output_embeddings().weight
        head[tok.eos_token_id] = head[tok.convert_tokens_to_ids("=")] * 0.9
    ids, mask = encode_prompts(tok, PROMPTS)
    return model, tok, ids, mask


def test_majority_vote_is_counter_most_common_over_valid_answers():
    answers = [None, "b", "a", "", "a", "b", "c"]
    assert majority_vote(answers) == Counter(["b", "a", "a", "b", "c"]).most_common(1)[0][0] == "b"
    assert majority_vote([None, ""]) is None
    assert majority_vote(["z", "y", "y"]) == "y"


def test_greedy_decoder_ignores_do_sample(tiny):
    model, tok, ids, mask = tiny
    sampled = SamplingParams(16, do_sample=True, temperature=1.5)
    greedy = GreedyDecoder()(model, tok, ids, mask, params=sampled, generator=torch.Generator().manual_seed(0))
    reference = SampleDecoder()(model, tok, ids, mask, params=SamplingParams(16, temperature=1.5))
    assert torch.equal(greedy.completion_ids, reference.completion_ids)
    assert greedy.texts == reference.texts


def test_self_consistency_is_n_independent_samples_and_a_majority_vote(tiny):
    model, tok, ids, mask = tiny
    n, params = 5, SamplingParams(12, do_sample=True, temperature=1.2)
    verifier = FirstCharacter()
    voted = SelfConsistencyDecoder(num_samples=n, temperature=None, verifier=verifier)(
        model, tok, ids, mask, params=params, generator=torch.Generator().manual_seed(3)
    )
    samples = SampleDecoder()(
        model,
        tok,
        ids.repeat_interleave(n, 0),
        mask.repeat_interleave(n, 0),
        params=params,
        generator=torch.Generator().manual_seed(3),
    )
    lengths = samples.lengths.tolist()
    assert len(set(lengths)) > 1, "samples must have different lengths"
    distinct_votes = 0
    for i in range(len(PROMPTS)):
        group = list(range(i * n, (i + 1) * n))
        answers = [verifier.extract_answer(samples.texts[j]) for j in group]
        winner = Counter(a for a in answers if a).most_common(1)[0][0]
        chosen = group[answers.index(winner)]
        distinct_votes += len(set(answers)) > 1
        assert voted.answers[i] == answers and voted.voted[i] == winner
        assert voted.texts[i] == samples.texts[chosen]
        assert (
            voted.completion_ids[i, : lengths[chosen]].tolist()
            == samples.completion_ids[chosen, : lengths[chosen]].tolist()
        )
        assert int(voted.lengths[i]) == lengths[chosen] and bool(voted.finished[i]) == bool(samples.finished[chosen])
        assert voted.decoded_tokens[i] == sum(lengths[j] for j in group)
    assert distinct_votes >= 2, "the vote must have something to decide"
    meta = voted.row_meta()
    assert meta["num_traces"] == [n] * len(PROMPTS) and meta["voted_answer"] == voted.voted


def test_self_consistency_bad_input():
    with pytest.raises(ConfigError, match="module.decoder.num_samples"):
        SelfConsistencyDecoder(num_samples=0)
    with pytest.raises(ConfigError, match="module.decoder.temperature"):
        SelfConsistencyDecoder(temperature=0.0)
    backbone = TinyBackbone(seed=0)
    model, tok = backbone.build_model().eval(), backbone.tokenizer
    ids, mask = encode_prompts(tok, PROMPTS[:1])
    with pytest.raises(ConfigError, match="do_sample=false"):
        SelfConsistencyDecoder(temperature=None)(model, tok, ids, mask, params=SamplingParams(4))


@pytest.mark.parametrize("name", ["greedy", "self_consistency", "dts"])
def test_decoder_group_entries_instantiate(train_cfg, name):
    cfg = train_cfg([f"module/decoder={name}", "task=forked"])
    decoder = instantiate(cfg.module.decoder, _convert_="all")
    assert type(decoder).__name__ == {"greedy": "GreedyDecoder", "self_consistency": "SelfConsistencyDecoder"}.get(
        name, "DTSDecoder"
    )
    if name != "greedy":
        assert type(decoder.verifier).__name__ == "ForkedTask"  # verifier: ${task}
