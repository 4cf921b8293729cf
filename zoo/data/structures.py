"""Synthetic all-atom 3D structure task (the CPU stand-in for Cuttlefish's GEO-AT / Mol-Instructions data).

Paper: "Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning", arXiv 2602.02780 (section 4(d) of
``research/multimodal_quant_data.md``).

Molecule-like graphs of ``min_atoms``..``max_atoms`` atoms (default 6..300) over five element types are built unit by
unit: single atoms on a self-avoiding random walk (bond length 1.5 Å, non-bonded atoms at least 2 Å apart), planar
six-membered carbon rings (bond 1.4 Å) and ``N-P-S`` triads. When the walk gets stuck it branches from a random
existing atom, so the bond graph is a tree plus the inserted rings (its only cycles). Edges are a radius graph
(default 4 Å, both directions, no self loops); chemical bonds are kept separately.

Questions (kind -> answer, all exact short strings):

- ``count``: "How many O atoms are there?" -> ``"7"``
- ``ring``: "Is there a six-membered ring?" -> ``"yes"``/``"no"``
- ``triad``: "Is there an N-P-S triad?" (a bonded path N-P-S, either direction) -> ``"yes"``/``"no"``; detected
  on the bond graph, so triads that appear by chance count as well
- ``distance``: "How far apart are the closest C and S atoms?" -> one of :data:`DISTANCE_BIN_LABELS`
  (``< 2 Å`` bonded, ``2-4`` close, ``4-8`` far, ``>= 8`` distant)
- ``ring_count``: "How many six-membered rings are there?" -> ``"0"``..``"<max_rings>"`` (inserted rings)
- ``triad_count``: "How many N-P-S triads are there?" -> ``"0"``.. (bonded N-P-S paths, counted by their middle P
  atom, so chance triads count)
- ``contact``: "Is an N-P-S triad bonded to a six-membered ring?" -> ``"yes"``/``"no"`` (a bond between an atom
  of a triad path and an atom of an inserted ring)

The last three ask for information that grows with the structure: with ``max_rings`` / ``max_triads`` set, the
motif counts are drawn uniformly (independent of size, so the answer carries no size cue) and the motifs are spread
over the whole structure; a connector that averages all atoms into a fixed budget sees the motifs' share of the atoms
shrink as the structure grows (``6 r / N``), while the count stays the same. ``contact_prob`` balances the relation
question: with a ring and a triad present, that share of structures bonds a triad directly to a ring, the rest keeps
them apart in the build order (the answer is read from the bonds either way).

Every sample is a pure function of ``(seed, index, config)``. Prompts contain the ``<structure>`` placeholder where
the connector inserts its tokens (:func:`zoo.multimodal.cuttlefish.insert_structure_tokens`).

Batch format (:func:`collate_structures`): atoms of all structures are **concatenated** with a graph index
(``batch``), PyG style, because sizes span two orders of magnitude (padding a 6-atom molecule to 300 atoms would
waste most of the encoder's work). Edge indices are offset into the concatenated atom list. Use
:func:`zoo.multimodal.structure_encoder.to_dense_batch` to obtain padded ``[B, N_max, ...]`` tensors plus an atom
mask where a per-structure view is needed (patching, cross-attention).

Bad input raises :class:`zoo.errors.DataError` naming the sample id: non-finite coordinates, an empty structure,
node/edge arrays that disagree, element types out of range, a prompt without (or with several) ``<structure>``
placeholders. Structures above a configured atom limit are rejected by :func:`filter_by_atom_limit` (which returns
the number rejected) or raise in :func:`collate_structures`; they are never truncated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.answers import AnswerVerifier
from zoo.errors import ConfigError, DataError

STRUCTURE_TOKEN = "<structure>"
ELEMENTS: tuple[str, ...] = ("C", "N", "O", "S", "P")
ELEMENT_INDEX = {e: i for i, e in enumerate(ELEMENTS)}
# Backbone element frequencies: hetero-atoms are rare so that an N-P-S path rarely appears by chance.
ELEMENT_PROBS: tuple[float, ...] = (0.7, 0.1, 0.1, 0.05, 0.05)
TRIAD: tuple[str, str, str] = ("N", "P", "S")
# kinds drawn by default; the counted-motif kinds need ``max_rings``/``max_triads``
DEFAULT_QUESTION_KINDS: tuple[str, ...] = ("count", "ring", "triad", "distance")
COUNTED_MOTIF_KINDS: tuple[str, ...] = ("ring_count", "triad_count", "contact")
QUESTION_KINDS: tuple[str, ...] = DEFAULT_QUESTION_KINDS + COUNTED_MOTIF_KINDS
DISTANCE_BIN_EDGES: tuple[float, ...] = (2.0, 4.0, 8.0)
DISTANCE_BIN_LABELS: tuple[str, ...] = ("bonded", "close", "far", "distant")
SIZE_BIN_EDGES: tuple[int, ...] = (25, 50, 100, 200)
SIZE_BIN_LABELS: tuple[str, ...] = ("<=25", "26-50", "51-100", "101-200", ">200")

_BOND = 1.5
_RING_BOND = 1.4


@dataclass(frozen=True)
class StructureTaskConfig:
    """Knobs of the synthetic structure task.

    Attributes:
        min_atoms, max_atoms: structure sizes are drawn log-uniformly in this range (inclusive).
        ring_prob: probability of inserting at least one six-ring (a second one with half this probability when the
            structure has at least 24 atoms).
        triad_prob: probability of inserting an ``N-P-S`` triad.
        radius: radius-graph cutoff in Å.
        min_separation: minimum distance in Å between non-bonded atoms (self-avoidance).
        question_kinds: kinds drawn uniformly per sample.
        max_rings, max_triads: ``None`` (default): one ring with ``ring_prob`` (a second one with half that
            probability at >= 24 atoms) and one triad with ``triad_prob``. Set both: the number of rings is uniform
            on ``0..min(max_rings, N // 6)`` and then the number of triads uniform on ``0..min(max_triads, (N - 6
            rings) // 3)`` (``ring_prob``/``triad_prob`` unused); the count and relation questions need this mode.
        contact_prob: with ``max_rings``/``max_triads`` set and at least one ring and one triad: probability that a
            triad is built bonded to a ring (else the build order keeps triads and rings apart).
    """

    min_atoms: int = 6
    max_atoms: int = 300
    ring_prob: float = 0.5
    triad_prob: float = 0.5
    radius: float = 4.0
    min_separation: float = 2.0
    question_kinds: tuple[str, ...] = DEFAULT_QUESTION_KINDS
    max_rings: int | None = None
    max_triads: int | None = None
    contact_prob: float = 0.5

    @property
    def counts_motifs(self) -> bool:
        """Motif counts drawn uniformly up to ``max_rings`` / ``max_triads`` (the count and relation questions)."""
        return self.max_rings is not None

    def __post_init__(self) -> None:
        if not 1 <= self.min_atoms <= self.max_atoms:
            raise ConfigError(f"need 1 <= min_atoms <= max_atoms, got {self.min_atoms}, {self.max_atoms}")
        unknown = set(self.question_kinds) - set(QUESTION_KINDS)
        if unknown or not self.question_kinds:
            raise ConfigError(
                f"question_kinds must be a non-empty subset of {QUESTION_KINDS}, got {self.question_kinds}"
            )
        if self.radius <= 0 or self.min_separation <= 0:
            raise ConfigError("radius and min_separation must be positive")
        if (self.max_rings is None) != (self.max_triads is None):
            raise ConfigError(
                f"set both max_rings and max_triads or neither, got max_rings={self.max_rings}, "
                f"max_triads={self.max_triads}"
            )
        if self.counts_motifs and (self.max_rings < 0 or self.max_triads < 0):
            raise ConfigError(f"max_rings and max_triads must be >= 0, got {self.max_rings}, {self.max_triads}")
        if not 0.0 <= self.contact_prob <= 1.0:
            raise ConfigError(f"contact_prob must lie in [0, 1], got {self.contact_prob}")
        needs = set(COUNTED_MOTIF_KINDS) & set(self.question_kinds)
        if needs and not self.counts_motifs:
            raise ConfigError(
                f"question kinds {sorted(needs)} need max_rings and max_triads (motif counts that vary); "
                "set task.max_rings and task.max_triads"
            )


@dataclass
class StructureSample:
    """One structure with a question.

    Attributes:
        sample_id: stable id (``"<seed>-<index>"`` for generated samples); every error message names it.
        atom_types: ``[N]`` long, indices into :data:`ELEMENTS`.
        pos: ``[N, 3]`` float coordinates in Å.
        edge_index: ``[2, E]`` long radius-graph edges (source row 0, target row 1), both directions.
        bonds: ``[2, E_b]`` long chemical bonds, both directions.
        prompt, answer, kind: question text (with one ``<structure>``), exact answer, question kind.
        meta: ground truth used to build questions (``n_rings``, ``has_triad``, ...).
    """

    sample_id: str
    atom_types: Tensor
    pos: Tensor
    edge_index: Tensor
    bonds: Tensor
    prompt: str
    answer: str
    kind: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_atoms(self) -> int:
        return int(self.atom_types.shape[0])

    @property
    def size_bin(self) -> str:
        return size_bin(self.num_atoms)

    def as_row(self) -> dict[str, Any]:
        """Row form (``prompt``, ``completion``, ``answer`` plus structure columns) for data sources."""
        return {
            "prompt": self.prompt,
            "completion": self.answer,
            "answer": self.answer,
            "kind": self.kind,
            "sample_id": self.sample_id,
            "size_bin": self.size_bin,
            "atom_types": self.atom_types,
            "pos": self.pos,
            "edge_index": self.edge_index,
        }


# ----------------------------------------------------------------------------------------------------------------
# bins, verifier
# ----------------------------------------------------------------------------------------------------------------


def size_bin(num_atoms: int) -> str:
    """The evaluation size bin of a structure (labels :data:`SIZE_BIN_LABELS`)."""
    for edge, label in zip(SIZE_BIN_EDGES, SIZE_BIN_LABELS):
        if num_atoms <= edge:
            return label
    return SIZE_BIN_LABELS[-1]


def distance_bin(distance: float) -> str:
    """The answer label of a distance in Å (labels :data:`DISTANCE_BIN_LABELS`)."""
    for edge, label in zip(DISTANCE_BIN_EDGES, DISTANCE_BIN_LABELS):
        if distance < edge:
            return label
    return DISTANCE_BIN_LABELS[-1]


def normalize_answer(text: str) -> str:
    """The answer of a completion: text after the last ``</think>`` (if any), first word, lower case, no punctuation."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    text = text.split("<eos>", 1)[0].strip().lower()
    words = text.split()
    return words[0].strip(".,;:!?\"'") if words else ""


class StructureAnswerVerifier(AnswerVerifier):
    """The structure task's verifier: the normalized first word of the completion (:func:`normalize_answer`)
    equals the lower-cased reference."""

    def extract_answer(self, completion: str) -> str:
        return normalize_answer(completion)

    def normalize_reference(self, answer: Any) -> str:
        return str(answer).strip().lower()


STRUCTURE_VERIFIER = StructureAnswerVerifier()


def verify_structure_answer(completion: str, answer: str) -> bool:
    """Exact verifier of the structure task (:class:`StructureAnswerVerifier`)."""
    return STRUCTURE_VERIFIER.verify(completion, answer)


def structure_reward(
    prompts: Sequence[Any], completions: Sequence[str], answer: Sequence[str], **_: Any
) -> list[float]:
    """TRL-style reward ``(prompts, completions, **columns) -> list[float]``: 1.0 if verified, else 0.0."""
    return [float(verify_structure_answer(c, a)) for c, a in zip(completions, answer)]


# ----------------------------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------------------------


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=3)
    return v / max(np.linalg.norm(v), 1e-12)


def _far_enough(new: np.ndarray, existing: np.ndarray, exempt: int | None, min_sep: float) -> bool:
    """Each row of ``new`` is at least ``min_sep`` from every existing atom (``exempt`` is bonded to row 0 only)."""
    if existing.shape[0] == 0:
        return True
    d = np.linalg.norm(new[:, None, :] - existing[None, :, :], axis=-1)
    if exempt is not None:
        d[0, exempt] = np.inf
    return bool((d >= min_sep).all())


class _Builder:
    def __init__(self, rng: np.random.Generator, min_sep: float) -> None:
        self.rng = rng
        self.min_sep = min_sep
        self.pos: list[np.ndarray] = []
        self.types: list[int] = []
        self.bonds: list[tuple[int, int]] = []
        self.ring_atoms: list[int] = []
        self.tip: int | None = None

    def _existing(self) -> np.ndarray:
        return np.asarray(self.pos, dtype=np.float64).reshape(-1, 3)

    def _candidate(self, kind: str, types: list[int]) -> tuple[np.ndarray, list[tuple[int, int]], int] | None:
        """Positions of a unit attached to ``self.tip``, its internal bonds (local indices) and its new tip."""
        origin = np.zeros(3) if self.tip is None else self.pos[self.tip]
        u = _unit(self.rng)
        first = origin if self.tip is None else origin + _BOND * u
        if kind == "ring":
            v = _unit(self.rng)
            v = v - v.dot(u) * u
            v /= max(np.linalg.norm(v), 1e-12)
            center = first + _RING_BOND * u
            ang = 2 * math.pi * np.arange(6) / 6
            new = center + _RING_BOND * (-np.cos(ang)[:, None] * u + np.sin(ang)[:, None] * v)
            return new, [(k, (k + 1) % 6) for k in range(6)], 3
        new = [first]
        for _ in range(len(types) - 1):  # triad: a short walk
            new.append(new[-1] + _BOND * _unit(self.rng))
        new_arr = np.stack(new)
        # internal self-avoidance of the walk (i, i+2)
        for i in range(len(new) - 2):
            if np.linalg.norm(new_arr[i] - new_arr[i + 2]) < self.min_sep:
                return None
        return new_arr, [(i, i + 1) for i in range(len(new) - 1)], len(new) - 1

    def add(self, kind: str, types: list[int], branch_from: Sequence[int] | None = None) -> None:
        """Place a unit bonded to the tip; when stuck, branch from a random atom (of ``branch_from`` if given)."""
        for attempt in range(400):
            if attempt and attempt % 20 == 0 and self.pos:  # stuck: branch from a random existing atom
                if branch_from:
                    self.tip = int(branch_from[int(self.rng.integers(len(branch_from)))])
                else:
                    self.tip = int(self.rng.integers(len(self.pos)))
            cand = self._candidate(kind, types)
            if cand is None:
                continue
            new, internal, new_tip = cand
            if not _far_enough(new, self._existing(), self.tip, self.min_sep):
                continue
            base = len(self.pos)
            if self.tip is not None:
                self.bonds.append((self.tip, base))
            self.bonds.extend((base + a, base + b) for a, b in internal)
            self.pos.extend(new)
            self.types.extend(types)
            if kind == "ring":
                self.ring_atoms.extend(range(base, base + len(types)))
            self.tip = base + new_tip
            return
        raise RuntimeError(f"could not place a {kind} unit after 400 attempts ({len(self.pos)} atoms placed)")


def _radius_graph(pos: Tensor, radius: float) -> Tensor:
    d = torch.cdist(pos, pos)
    adj = (d <= radius) & ~torch.eye(pos.shape[0], dtype=torch.bool)
    return adj.nonzero().t().contiguous()


def _neighbours(bonds: Tensor) -> dict[int, set[int]]:
    nbrs: dict[int, set[int]] = {}
    for i, j in bonds.t().tolist():
        nbrs.setdefault(i, set()).add(j)
    return nbrs


def triad_paths(types: Tensor, bonds: Tensor) -> list[tuple[int, set[int], set[int]]]:
    """Bonded ``TRIAD[0]-TRIAD[1]-TRIAD[2]`` paths (undirected), one per middle atom: ``(middle, first-element
    neighbours, last-element neighbours)``. Their number is the ``triad_count`` answer."""
    a, b, c = (ELEMENT_INDEX[e] for e in TRIAD)
    nbrs = _neighbours(bonds)
    paths = []
    for mid in (types == b).nonzero().flatten().tolist():
        ns = nbrs.get(mid, set())
        firsts = {n for n in ns if types[n] == a}
        lasts = {n for n in ns if types[n] == c}
        if firsts and lasts:
            paths.append((mid, firsts, lasts))
    return paths


def _has_triad(types: Tensor, bonds: Tensor) -> bool:
    """A bonded path ``TRIAD[0]-TRIAD[1]-TRIAD[2]`` (undirected)."""
    return bool(triad_paths(types, bonds))


def triad_ring_contact(types: Tensor, bonds: Tensor, ring_atoms: Sequence[int]) -> bool:
    """Whether an atom of a triad path (:func:`triad_paths`) is bonded to one of ``ring_atoms`` (the ``contact``
    answer)."""
    triad_atoms: set[int] = set()
    for mid, firsts, lasts in triad_paths(types, bonds):
        triad_atoms |= {mid, *firsts, *lasts}
    rings = set(ring_atoms)
    return any(i in triad_atoms and j in rings for i, j in bonds.t().tolist())


def _motif_units(num_atoms: int, rng: np.random.Generator, cfg: StructureTaskConfig) -> list[str]:
    """The build order of the counted-motif mode: ``max_rings``/``max_triads`` uniform counts, a ring followed
    directly by a triad with ``contact_prob`` (when both exist), else no triad next to a ring where the singles
    allow it."""
    n_rings = int(rng.integers(min(cfg.max_rings, num_atoms // 6) + 1))
    n_triads = int(rng.integers(min(cfg.max_triads, (num_atoms - 6 * n_rings) // 3) + 1))
    singles = num_atoms - 6 * n_rings - 3 * n_triads
    touch = n_rings > 0 and n_triads > 0 and rng.random() < cfg.contact_prob
    if touch:  # one "ring_triad" unit: a ring, then a triad bonded to one of its atoms ("triad_on_ring")
        units = ["ring_triad"] + ["ring"] * (n_rings - 1) + ["triad"] * (n_triads - 1) + ["atom"] * singles
        rng.shuffle(units)
        return [u for unit in units for u in (("ring", "triad_on_ring") if unit == "ring_triad" else (unit,))]
    motifs = ["ring"] * n_rings + ["triad"] * n_triads
    rng.shuffle(motifs)
    if n_rings and n_triads and singles >= len(motifs) - 1:
        # a single atom between consecutive motifs, the other singles spread at random over the gaps
        gaps = np.bincount(rng.integers(len(motifs) + 1, size=singles - (len(motifs) - 1)), minlength=len(motifs) + 1)
        units: list[str] = ["atom"] * int(gaps[0])
        for i, m in enumerate(motifs):
            units += [m] + ["atom"] * (int(gaps[i + 1]) + int(i < len(motifs) - 1))
        return units
    units = motifs + ["atom"] * singles
    rng.shuffle(units)
    return units


def generate_structure(
    num_atoms: int, rng: np.random.Generator, config: StructureTaskConfig | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
    """A random molecule-like structure with exactly ``num_atoms`` atoms.

    Returns ``(atom_types [N], pos [N, 3] float32, edge_index [2, E], bonds [2, E_b], meta)``; ``meta`` holds
    ``n_rings``, ``has_triad`` and ``n_triads`` (detected on the bond graph), ``contact``
    (:func:`triad_ring_contact`) and ``triad_inserted``.
    """
    cfg = config or StructureTaskConfig()
    if num_atoms < 1:
        raise ConfigError(f"num_atoms must be >= 1, got {num_atoms}")
    if cfg.counts_motifs:
        units = _motif_units(num_atoms, rng, cfg)
    else:
        n_rings = 0
        if num_atoms >= 6 and rng.random() < cfg.ring_prob:
            n_rings = 1 + int(num_atoms >= 24 and rng.random() < 0.5)
        remaining = num_atoms - 6 * n_rings
        triad = remaining >= 3 and rng.random() < cfg.triad_prob
        singles = remaining - 3 * int(triad)
        units = ["ring"] * n_rings + ["triad"] * int(triad) + ["atom"] * singles
        rng.shuffle(units)
    builder = _Builder(rng, cfg.min_separation)
    c = ELEMENT_INDEX["C"]
    for kind in units:
        if kind == "ring":
            builder.add("ring", [c] * 6)
        elif kind == "triad":
            builder.add("triad", [ELEMENT_INDEX[e] for e in TRIAD])
        elif kind == "triad_on_ring":
            builder.add("triad", [ELEMENT_INDEX[e] for e in TRIAD], branch_from=builder.ring_atoms[-6:])
        else:
            builder.add("atom", [int(rng.choice(len(ELEMENTS), p=ELEMENT_PROBS))])
    types = torch.tensor(builder.types, dtype=torch.long)
    pos = torch.tensor(np.asarray(builder.pos), dtype=torch.float32)
    pos = pos - pos.mean(0, keepdim=True)
    bond_pairs = torch.tensor(builder.bonds, dtype=torch.long).reshape(-1, 2).t()
    bonds = torch.cat([bond_pairs, bond_pairs.flip(0)], dim=1)
    edge_index = _radius_graph(pos, cfg.radius)
    paths = triad_paths(types, bonds)
    meta = {
        "n_rings": units.count("ring"),
        "has_triad": bool(paths),
        "n_triads": len(paths),
        "contact": triad_ring_contact(types, bonds, builder.ring_atoms),
        "triad_inserted": units.count("triad") + units.count("triad_on_ring"),
    }
    return types, pos, edge_index, bonds, meta


def _question(
    kind: str, types: Tensor, pos: Tensor, meta: dict[str, Any], rng: np.random.Generator
) -> tuple[str, str, dict[str, Any]]:
    if kind == "count":
        el = ELEMENTS[int(rng.integers(len(ELEMENTS)))]
        count = int((types == ELEMENT_INDEX[el]).sum())
        return f"{STRUCTURE_TOKEN}\nHow many {el} atoms are there?", str(count), {"element": el}
    if kind == "ring":
        return f"{STRUCTURE_TOKEN}\nIs there a six-membered ring?", "yes" if meta["n_rings"] else "no", {}
    name = "-".join(TRIAD)
    if kind == "triad":
        return f"{STRUCTURE_TOKEN}\nIs there an {name} triad?", "yes" if meta["has_triad"] else "no", {}
    if kind == "ring_count":
        return f"{STRUCTURE_TOKEN}\nHow many six-membered rings are there?", str(meta["n_rings"]), {}
    if kind == "triad_count":
        return f"{STRUCTURE_TOKEN}\nHow many {name} triads are there?", str(meta["n_triads"]), {}
    if kind == "contact":
        prompt = f"{STRUCTURE_TOKEN}\nIs an {name} triad bonded to a six-membered ring?"
        return prompt, "yes" if meta["contact"] else "no", {}
    # distance: the closest pair of two element types present (two distinct atoms when the types coincide)
    counts = torch.bincount(types, minlength=len(ELEMENTS))
    present = [i for i in range(len(ELEMENTS)) if counts[i] > 0]
    pairs = [(a, b) for a in present for b in present if a < b or (a == b and counts[a] >= 2)]
    if not pairs:  # a single atom: fall back to a count question
        return _question("count", types, pos, meta, rng)
    a, b = pairs[int(rng.integers(len(pairs)))]
    d = torch.cdist(pos[types == a].double(), pos[types == b].double())
    if a == b:
        d.fill_diagonal_(float("inf"))
    dist = float(d.min())
    prompt = f"{STRUCTURE_TOKEN}\nHow far apart are the closest {ELEMENTS[a]} and {ELEMENTS[b]} atoms?"
    return prompt, distance_bin(dist), {"pair": (ELEMENTS[a], ELEMENTS[b]), "distance": dist}


def make_structure_sample(seed: int, index: int, config: StructureTaskConfig | None = None) -> StructureSample:
    """Sample ``index`` of the stream with ``seed`` (a pure function of its arguments)."""
    cfg = config or StructureTaskConfig()
    rng = np.random.default_rng([seed, index])
    lo, hi = math.log(cfg.min_atoms), math.log(cfg.max_atoms + 1)
    n = min(cfg.max_atoms, max(cfg.min_atoms, int(math.exp(rng.uniform(lo, hi)))))
    types, pos, edge_index, bonds, meta = generate_structure(n, rng, cfg)
    kind = cfg.question_kinds[int(rng.integers(len(cfg.question_kinds)))]
    prompt, answer, qmeta = _question(kind, types, pos, meta, rng)
    if kind == "distance" and "pair" not in qmeta:
        kind = "count"
    return StructureSample(
        sample_id=f"{seed}-{index}",
        atom_types=types,
        pos=pos,
        edge_index=edge_index,
        bonds=bonds,
        prompt=prompt,
        answer=answer,
        kind=kind,
        meta={**meta, **qmeta},
    )


def make_structure_samples(n: int, seed: int, config: StructureTaskConfig | None = None) -> list[StructureSample]:
    """The first ``n`` samples of the stream with ``seed``."""
    return [make_structure_sample(seed, i, config) for i in range(n)]


class StructureQADataset(torch.utils.data.Dataset):
    """Map-style dataset of generated samples; item ``i`` is :func:`make_structure_sample` ``(seed, i)``."""

    def __init__(self, size: int, seed: int = 0, config: StructureTaskConfig | None = None) -> None:
        self.size, self.seed, self.config = size, seed, config or StructureTaskConfig()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> StructureSample:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return make_structure_sample(self.seed, index, self.config)


# ----------------------------------------------------------------------------------------------------------------
# validation, filtering, collate
# ----------------------------------------------------------------------------------------------------------------


def validate_structure_sample(sample: StructureSample, max_atoms: int | None = None) -> None:
    """Raise :class:`~zoo.errors.DataError` naming ``sample.sample_id`` if the sample is malformed or too large."""
    sid = f"structure sample {sample.sample_id!r}"
    types, pos, edges = sample.atom_types, sample.pos, sample.edge_index
    if types.ndim != 1:
        raise DataError(f"{sid}: atom_types must be 1-D [N], got shape {tuple(types.shape)}")
    n = types.shape[0]
    if n == 0:
        raise DataError(f"{sid}: empty structure (0 atoms)")
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise DataError(f"{sid}: pos must be [N, 3], got shape {tuple(pos.shape)}")
    if pos.shape[0] != n:
        raise DataError(f"{sid}: {n} atom types but {pos.shape[0]} coordinates")
    if not torch.isfinite(pos).all():
        bad = (~torch.isfinite(pos)).any(1).nonzero().flatten()[:5].tolist()
        raise DataError(f"{sid}: non-finite (NaN/inf) coordinates at atoms {bad}")
    if types.min() < 0 or types.max() >= len(ELEMENTS):
        raise DataError(
            f"{sid}: element types must lie in [0, {len(ELEMENTS)}), got range [{types.min()}, {types.max()}]"
        )
    for name, e in (("edge_index", edges), ("bonds", sample.bonds)):
        if e.ndim != 2 or e.shape[0] != 2:
            raise DataError(f"{sid}: {name} must be [2, E], got shape {tuple(e.shape)}")
        if e.numel() and (e.min() < 0 or e.max() >= n):
            raise DataError(f"{sid}: {name} refers to atom {int(e.max())} but the structure has {n} atoms")
    count = sample.prompt.count(STRUCTURE_TOKEN)
    if count != 1:
        raise DataError(f"{sid}: prompt must contain exactly one {STRUCTURE_TOKEN} placeholder, found {count}")
    if max_atoms is not None and n > max_atoms:
        raise DataError(
            f"{sid}: {n} atoms exceed max_atoms={max_atoms}; filter with filter_by_atom_limit (never truncated)"
        )


def filter_by_atom_limit(samples: Sequence[StructureSample], max_atoms: int) -> tuple[list[StructureSample], int]:
    """Keep samples with at most ``max_atoms`` atoms; return ``(kept, number_rejected)`` (paper filter: 30k atoms)."""
    kept = [s for s in samples if s.num_atoms <= max_atoms]
    return kept, len(samples) - len(kept)


@dataclass
class StructureBatch:
    """Concatenated structures (PyG style).

    Attributes:
        atom_types: ``[A]`` long, ``A`` = total atoms in the batch.
        pos: ``[A, 3]`` float.
        batch: ``[A]`` long graph index of each atom (sorted, ``0..B-1``).
        edge_index: ``[2, E]`` long, indices into the concatenated atoms.
        num_atoms: ``[B]`` long atoms per structure.
        prompts, answers, kinds, sample_ids, size_bins: per-structure lists of length ``B``.
    """

    atom_types: Tensor
    pos: Tensor
    batch: Tensor
    edge_index: Tensor
    num_atoms: Tensor
    prompts: list[str]
    answers: list[str]
    kinds: list[str]
    sample_ids: list[str]
    size_bins: list[str]

    @property
    def num_graphs(self) -> int:
        return int(self.num_atoms.shape[0])

    def to(self, device: torch.device | str) -> StructureBatch:
        return StructureBatch(
            atom_types=self.atom_types.to(device),
            pos=self.pos.to(device),
            batch=self.batch.to(device),
            edge_index=self.edge_index.to(device),
            num_atoms=self.num_atoms.to(device),
            prompts=self.prompts,
            answers=self.answers,
            kinds=self.kinds,
            sample_ids=self.sample_ids,
            size_bins=self.size_bins,
        )


def collate_structures(samples: Sequence[StructureSample], max_atoms: int | None = None) -> StructureBatch:
    """Validate and concatenate samples into a :class:`StructureBatch` (raises naming the first bad sample)."""
    if not samples:
        raise DataError("collate_structures got an empty list of samples")
    for s in samples:
        validate_structure_sample(s, max_atoms=max_atoms)
    counts = torch.tensor([s.num_atoms for s in samples], dtype=torch.long)
    offsets = torch.cumsum(counts, 0) - counts
    return StructureBatch(
        atom_types=torch.cat([s.atom_types.long() for s in samples]),
        pos=torch.cat([s.pos.float() for s in samples]),
        batch=torch.repeat_interleave(torch.arange(len(samples)), counts),
        edge_index=torch.cat([s.edge_index.long() + int(o) for s, o in zip(samples, offsets)], dim=1),
        num_atoms=counts,
        prompts=[s.prompt for s in samples],
        answers=[s.answer for s in samples],
        kinds=[s.kind for s in samples],
        sample_ids=[s.sample_id for s in samples],
        size_bins=[s.size_bin for s in samples],
    )
