"""benchmarks/grpo_vs_trl.py compares one learning problem: both trainers start from the same saved base policy of
``+method=grpo``, see the same prompts in the same order (the same token ids), score them with the same reward-function
objects, and run with the settings of the composed config. One step per arm on the small test base policy; no timing."""

from __future__ import annotations

import importlib
import sys

import pytest

trl = pytest.importorskip("trl")

from tests.conftest import REPO_ROOT, SMALL_BASE_POLICY  # noqa: E402
from zoo.encoding import encode_prompt  # noqa: E402

# settings away from the defaults, so that the TRL arm can only match them by reading the composed config
OVERRIDES = [
    *SMALL_BASE_POLICY,
    "module.group_size=4",
    "datamodule.batch_size=3",
    "module.generation.max_new_tokens=24",
    "module.generation.temperature=0.7",
    "module.optimizer.lr=1e-4",
    "module.policy_loss.eps_low=0.1",
]


def benchmark():
    """``benchmarks/grpo_vs_trl.py`` imported as the script runs (its folder on ``sys.path``)."""
    folder = str(REPO_ROOT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("grpo_vs_trl")
    finally:
        sys.path.remove(folder)


def test_both_arms_train_the_same_problem(base_policy_cache, tmp_path):
    import zoo.cli  # noqa: F401  (registers the app that builds the base policy)
    from zoo.cli.bootstrap import base_policy_dir

    bench = benchmark()
    problem = bench.setup(1, "base", cache_dir=base_policy_cache, overrides=OVERRIDES)
    # the weights: the export of the base-policy artifact a `python train.py +method=grpo` run starts from
    assert problem.model_dir == base_policy_dir(problem.cfg) and (problem.model_dir / "config.json").is_file()
    assert problem.model_dir.is_relative_to(base_policy_cache)

    zoo_log, trl_log = bench.RewardLog(), bench.RewardLog()
    zoo_run = bench.run_zoo(problem, log=zoo_log)
    trl_run = bench.run_trl(problem, log=trl_log)
    assert zoo_run["steps"] == trl_run["steps"] == 1
    assert len(zoo_log.calls) == len(trl_log.calls) == len(problem.reward_fns) == 1

    # the same prompts in the same order, G rows each, with the same columns
    rows = problem.rows()
    assert len(rows) == 3
    expected = [row["prompt"] for row in rows for _ in range(4)]
    zoo_call, trl_call = zoo_log.calls[0], trl_log.calls[0]
    assert zoo_call["prompts"] == expected and trl_call["prompts"] == expected
    # the same reward-function object, and each arm's scores are that function's on its completions
    function = problem.reward_fns["accuracy"]
    assert zoo_call["function"] is function and trl_call["function"] is function
    answers = [row["answer"] for row in rows for _ in range(4)]
    for call in (zoo_call, trl_call):
        assert len(call["completions"]) == 12
        assert call["scores"] == function(prompts=expected, completions=call["completions"], answer=answers)
        assert all(1 <= n <= 24 for n in call["lengths"])
    assert zoo_run["step_rewards"] == [sum(zoo_call["scores"]) / 12]

    # TRL tokenizes its prompt text to the zoo's prompt ids (BOS included)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(problem.model_dir, local_files_only=True)
    for row in rows:
        text = bench.trl_prompt(tokenizer, row["prompt"])
        assert tokenizer(text=text)["input_ids"] == encode_prompt(tokenizer, row["prompt"])

    # TRL's settings are the composed run's
    config = bench.trl_config(problem, tmp_path)
    assert (config.num_generations, config.per_device_train_batch_size) == (4, 12)
    assert (config.max_completion_length, config.temperature, config.learning_rate) == (24, 0.7, 1e-4)
    assert (config.epsilon, config.epsilon_high, config.beta, config.weight_decay) == (0.1, 0.1, 0.0, 0.0)
    assert config.lr_scheduler_type == "constant" and config.shuffle_dataset is False
    assert config.loss_type == "dapo" and config.scale_rewards == "group" and config.max_grad_norm == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--init", "trained"], "invalid choice: 'trained'"),
        (["--model", "/nonexistent/model"], "no save_pretrained directory there"),
        (["--steps", "0"], "must be >= 1"),
    ],
)
def test_bad_arguments_exit_2_with_one_message(argv, message, monkeypatch, capsys):
    bench = benchmark()
    monkeypatch.setattr(sys, "argv", ["grpo_vs_trl.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
