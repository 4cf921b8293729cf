"""The GEM demo's design (conf/demo/gem.yaml): RegMix's regressor gets enough proxies to fit and to be scored on
held-out proxies, and the sweep has the seeds its page needs."""

from __future__ import annotations

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf


def composed_demo(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        return compose(config_name="train", overrides=["+demo=gem", *overrides], return_hydra_config=True)


def test_regmix_proxies_are_several_times_the_regressors_unknowns():
    """The linear regressor fits a weight per bucket and an intercept (K + 1 unknowns); with fewer proxies than that
    (an earlier design: 12 for 14 unknowns) it interpolates and ranks held-out proxies at chance."""
    cfg = composed_demo("demo/gem/mixer=regmix")
    node = cfg.datamodule.sampler.weights_file
    unknowns = cfg.num_buckets + 1
    assert node.regressor == "linear"
    assert node.num_proxies >= 3 * unknowns
    # every held-out split (a quarter of the proxies, zoo.mixing.regmix.holdout_spearman) ranks at least 10 proxies
    assert round(0.25 * node.num_proxies) >= 10
    assert node.num_splits >= 10


def test_sweep_has_three_seeds_and_both_mixers():
    params = OmegaConf.to_container(composed_demo().hydra.sweeper.params)
    assert len(str(params["seed"]).split(",")) >= 3
    assert set(str(params["demo/gem/mixer"]).split(",")) == {"doremi", "regmix"}
    assert {"kmeans", "gem"} <= set(str(params["bucketing"]).split(","))
    # seed varies slowest: a sweep stopped early leaves every arm of the finished seeds
    assert next(iter(params)) == "seed"
