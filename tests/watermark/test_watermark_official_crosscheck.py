"""Cross-check of the zoo's SemStamp / k-SemStamp rules against the official code, on identical inputs.

Official code: github.com/bohanhou14/SemStamp, snapshot commit 97db73d11fd80f376a02b0a604d500627622f7e6
(2024-12-08). Files read:

* ``sbert_lsh_model.py`` -- the signature: nearpy ``RandomBinaryProjections.hash_vector`` gives the string of bits
  ``'1' if <normal_i, e> > 0 else '0'`` in the order of the normals, turned into an int by ``int(s, 2)``, so the
  first normal is the most significant bit (the zoo makes it the least significant: a fixed relabelling of the
  regions, asserted below as such).
* ``sampling_lsh_utils.py`` -- ``reject_close_generation``: accept when ``min_i |cos(e, n_i)| >= margin``.
* ``detection_utils.py`` -- ``detect_lsh`` / ``detect_kmeans``: ``sents[0]`` only keys the green set of ``sents[1]``
  (the texts passed are prompt + generation, so with a one-sentence prompt ``sents[0]`` is the prompt); each later
  sentence is green when its region is in the mask of the previous sentence's region;
  ``z = (n_green - lmbd n) / sqrt(n lmbd (1 - lmbd))`` with ``n = len(sents) - 1``.
* ``sampling_kmeans_utils.py`` -- ``get_cluster_id``: ``argmin`` of ``pairwise_cosine`` (``1 - cos``) to the
  centres; ``kmeans_reject_overlap``: accept when ``d_2nd - d_1st > margin`` (strict; the zoo's sampler uses
  ``>=``, which differs only on an exact tie); the centres come from ``kmeans_pytorch.kmeans(...,
  distance='cosine')``.

The official green masks come from ``torch.randperm`` on CUDA seeded by ``15485863 * region``; the zoo keys its
green sets on SHA-256 of ``key:region``, so the detection check plugs the zoo's green sets into the official
counting rule and z formula (only the keyed draw differs, by design).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from zoo.text.encoders import HashingEncoder
from zoo.watermark.detect import detect
from zoo.watermark.green import green_regions
from zoo.watermark.partition import KMeansPartitioner, LSHPartitioner
from zoo.watermark.sampler import WatermarkScheme
from zoo.watermark.sentences import split_sentences

# --- the official rules, transcribed ---------------------------------------------------------------------------


def official_lsh_hash(embeddings: torch.Tensor, normals: torch.Tensor) -> list[int]:
    """nearpy's bit string (first normal first, ``> 0``) read as a binary number."""
    projections = embeddings @ normals.T
    return [int("".join("1" if p > 0.0 else "0" for p in row.tolist()), 2) for row in projections]


def official_lsh_margin(embeddings: torch.Tensor, normals: torch.Tensor) -> torch.Tensor:
    """``min_i |cos(e, n_i)|`` as in ``reject_close_generation``."""
    sims = F.cosine_similarity(embeddings[:, None, :], normals[None, :, :], dim=-1)
    return sims.abs().min(dim=1).values


def official_cluster_id_and_gap(embeddings: torch.Tensor, centers: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """``argmin (1 - cos)`` to the centres and ``d_2nd - d_1st`` as in ``kmeans_reject_overlap``."""
    a = embeddings / embeddings.norm(dim=-1, keepdim=True)
    b = centers / centers.norm(dim=-1, keepdim=True)
    dis = 1 - a @ b.T
    ranked = torch.argsort(dis, dim=-1)
    rows = torch.arange(dis.shape[0])
    gap = dis[rows, ranked[:, 1]] - dis[rows, ranked[:, 0]]
    return ranked[:, 0].tolist(), gap


def official_detect(region_ids: list[int], mask_of, lmbd: float) -> tuple[int, float]:
    """``detect_lsh`` / ``detect_kmeans`` on the regions of ``sents`` (``sents[0]`` keys, is not scored)."""
    n_green = 0
    mask = mask_of(region_ids[0])
    for region in region_ids[1:]:
        n_green += int(region in mask)
        mask = mask_of(region)
    n = len(region_ids) - 1
    return n_green, (n_green - lmbd * n) / math.sqrt(n * lmbd * (1 - lmbd))


# --- helpers ---------------------------------------------------------------------------------------------------


def bit_reverse(value: int, bits: int) -> int:
    return int(format(value, f"0{bits}b")[::-1], 2)


def random_rows(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


PROMPT = "The committee met on Tuesday to review the harbour budget."
TEXT = (
    "Several members asked why the dredging costs had doubled. The engineer explained that silt had built up "
    "after the storms. A new survey will be ordered next month. Funding for the ferry terminal was postponed. "
    "The mayor promised a public hearing in spring. Local fishermen welcomed the delay."
)


# --- (a) SemStamp's signature and margin -----------------------------------------------------------------------


def test_lsh_signature_and_margin_match_official() -> None:
    x = random_rows(500, 24, seed=1)
    part = LSHPartitioner(num_regions=8, seed=3).fit(x)
    # nearpy draws raw Gaussian normals (not unit); a positive rescaling must not matter
    scales = torch.tensor([0.3, 2.0, 7.5], dtype=torch.float64)[:, None]
    normals = part.normals * scales
    probe = random_rows(400, 24, seed=2) * 3.0
    regions, margins = part.assign_with_margin(probe)
    official = official_lsh_hash(probe, normals)
    # the same regions up to the bit order (official: first normal = most significant bit)
    assert [bit_reverse(int(r), 3) for r in regions] == official
    assert sorted(set(official)) == list(range(8))  # every region reached, so the relabelling is exercised
    assert (margins - official_lsh_margin(probe, normals)).abs().max() < 1e-12
    # the acceptance tests agree (both ">= margin") at a margin inside the observed range
    ordered = margins.sort().values
    m = float(ordered[199] + ordered[200]) / 2  # between two observed margins, away from float ties
    assert torch.equal(margins >= m, official_lsh_margin(probe, normals) >= m)


# --- (c) k-SemStamp's assignment and margin --------------------------------------------------------------------


def test_kmeans_assignment_and_margin_match_official() -> None:
    x = random_rows(400, 16, seed=4)
    part = KMeansPartitioner(num_regions=8, seed=0, iters=10, restarts=1).fit(x)
    # the official centres are unnormalised means; give them arbitrary positive norms
    centers = part.centroids * torch.linspace(0.5, 4.0, 8, dtype=torch.float64)[:, None]
    probe = random_rows(300, 16, seed=5) * 0.1
    regions, margins = part.assign_with_margin(probe)
    ids, gap = official_cluster_id_and_gap(probe, centers)
    assert regions.tolist() == ids
    assert len(set(ids)) == 8
    assert (margins - gap).abs().max() < 1e-12


# --- (b) the detection z-score, sentence 1 keyed on the prompt --------------------------------------------------


def _official_regions(scheme: WatermarkScheme, sentences: list[str]) -> list[int]:
    x = scheme.encoder.encode(sentences).to(torch.float64)
    part = scheme.partitioner
    if isinstance(part, LSHPartitioner):
        return official_lsh_hash(x, part.normals)
    return official_cluster_id_and_gap(x, part.centroids)[0]


def _zoo_mask_in_official_labels(scheme: WatermarkScheme, relabel):
    """The zoo's green set of a previous region, written in the official region labels."""

    def mask_of(previous_official: int) -> set[int]:
        zoo_green = green_regions(scheme.key, relabel(previous_official), scheme.partitioner.num_regions, scheme.gamma)
        return {relabel(int(g)) for g in zoo_green}

    return mask_of


def _schemes() -> list[tuple[WatermarkScheme, object]]:
    encoder = HashingEncoder(dim=32)
    fit = encoder.encode(split_sentences(TEXT + " " + PROMPT) * 4) + 0.05 * random_rows(28, 32, seed=6).float()
    lsh = LSHPartitioner(num_regions=8, seed=11).fit(fit)
    km = KMeansPartitioner(num_regions=4, seed=0, iters=10, restarts=1).fit(fit)
    return [
        (WatermarkScheme(encoder, lsh, key=7, gamma=0.5), lambda r: bit_reverse(r, 3)),
        (WatermarkScheme(encoder, km, key=7, gamma=0.5), lambda r: r),
    ]


def test_detection_z_matches_official_with_prompt() -> None:
    for scheme, relabel in _schemes():
        sents = [PROMPT, *split_sentences(TEXT)]
        official_ids = _official_regions(scheme, sents)
        n_green, z = official_detect(official_ids, _zoo_mask_in_official_labels(scheme, relabel), scheme.gamma)
        for text in (TEXT, PROMPT + " " + TEXT):  # with or without the prompt in front
            result = detect(text, scheme, prompt=PROMPT)
            assert [relabel(r) for r in result.regions] == official_ids[1:]
            assert result.num_scored == len(sents) - 1  # sentence 1 is scored
            assert result.num_green == n_green
            assert result.z is not None and abs(result.z - z) < 1e-9
        # official detect_lsh on prompt + text == zoo detect without prompt on the same string
        no_prompt = detect(PROMPT + " " + TEXT, scheme)
        assert no_prompt.num_green == n_green and abs(no_prompt.z - z) < 1e-9
        # without the prompt both drop sentence 1 of the text: official detect_lsh(text's sentences) == zoo
        bare_green, bare_z = official_detect(
            official_ids[1:], _zoo_mask_in_official_labels(scheme, relabel), scheme.gamma
        )
        bare = detect(TEXT, scheme)
        assert bare.num_scored == len(sents) - 2
        assert bare.num_green == bare_green and abs(bare.z - bare_z) < 1e-9
