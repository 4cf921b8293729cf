"""Data mixing: GEM bucketing (vMF clustering with a balance term), DoReMi and RegMix mixers. Plain torch cores.

- :mod:`zoo.mixing.clustering` -- k-means, spherical k-means, vMF-EM, GEM (:func:`fit_gem`), balance metrics
- :mod:`zoo.mixing.vmf` -- safe log-Bessel, vMF normaliser, Banerjee's kappa
- :mod:`zoo.mixing.gis` -- Geometric Influence Score, pseudo-labels, the linear student
- :mod:`zoo.mixing.bucketing` -- the bucketing pipeline of ``+method=gem``
- :mod:`zoo.mixing.embeddings` -- MiniLM / sentence-transformers / TF-IDF+SVD embeddings, cached
- :mod:`zoo.mixing.doremi` -- :func:`doremi_update` and the running average
- :mod:`zoo.mixing.regmix` -- Dirichlet mixtures, regressors, top-k simulation, Spearman probe
"""

from zoo.mixing.clustering import (
    ClusteringResult,
    fit_gem,
    fit_vmf_em,
    kmeans,
    mass_entropy,
    max_share,
    normalized_mutual_info,
    spherical_kmeans,
)
from zoo.mixing.doremi import DoReMiWeights, domain_excess_loss, domain_loss_weights, doremi_update
from zoo.mixing.gis import geometric_influence_score, select_pseudo_labels, train_student
from zoo.mixing.regmix import (
    holdout_spearman,
    make_regressor,
    mixture_prior,
    predict_best_mixture,
    sample_mixtures,
    spearman,
)
from zoo.mixing.vmf import banerjee_kappa, log_bessel_iv, vmf_log_normalizer

__all__ = [
    "ClusteringResult",
    "DoReMiWeights",
    "banerjee_kappa",
    "domain_excess_loss",
    "domain_loss_weights",
    "doremi_update",
    "fit_gem",
    "fit_vmf_em",
    "geometric_influence_score",
    "holdout_spearman",
    "kmeans",
    "log_bessel_iv",
    "make_regressor",
    "mass_entropy",
    "max_share",
    "mixture_prior",
    "normalized_mutual_info",
    "predict_best_mixture",
    "sample_mixtures",
    "select_pseudo_labels",
    "spearman",
    "spherical_kmeans",
    "train_student",
    "vmf_log_normalizer",
]
