"""EvolveLab's modular design space: a memory system is a genotype Encode x Store x Retrieve x Manage.

MemEvolve (arXiv 2512.18746, Sec. 3) decomposes a memory system into four modules. :class:`Genotype` names one
choice per module; :class:`ModularMemory` implements the EvolveLab interface (:mod:`zoo.agents.memory_interface`)
for any genotype, with a persistent per-system store directory.

* Encode: ``raw`` trajectory, ``insight``, ``skill`` -- :func:`zoo.memory.distill.encode`;
* Store: ``list`` (JSONL), ``vector`` (JSONL + persisted embeddings), ``graph`` (JSONL + edges within a group) --
  :class:`MemoryStore`;
* Retrieve: ``recency``, ``bm25``, ``cosine``, ``hybrid`` (alpha) + ``top_k`` -- :meth:`ModularMemory.scores`;
* Manage: ``none``, ``dedup``, ``decay`` (tau), ``consolidate`` (every k ingests) --
  :meth:`ModularMemory.take_in_memory`.

Rules every system keeps (the invariants of the research notes, sec. 3e):

* ``provide_memory`` returns at most ``top_k`` items sorted by score (descending, ties by insertion order), the same
  items for the same store and request; a system whose ``phases`` exclude the request's status returns nothing.
* Under any Manage other than ``none``, an item identical to an active one (whitespace/case-normalised) is not
  added again: the original's ``count`` goes up and it keeps its id (idempotent; never deleted, mem0 #1674). An item
  whose ``key`` matches an active item with different content *supersedes* it: the old item stays in the store,
  inactive, with ``superseded_by`` (never silently dropped, mem0 #4536). ``none`` appends everything.
* ``decay``: relevance is min-max normalised over the active items and multiplied by ``exp(-age / tau)``, age in
  ingested trajectories [interp]. ``consolidate``: every ``consolidate_every`` ingests the active insight/skill items
  of a group merge into one item carrying all their facts (later facts win per key); the originals stay, inactive,
  with ``consolidated_into`` [interp].
* ``graph``: the best ``ceil(top_k / 2)`` items seed the result; the rest of ``top_k`` is filled with their graph
  neighbours (items of the same group) by score, then by score alone ([interp] of the graph-expand retrievers).
* Dense scoring uses a :mod:`zoo.text.encoders` encoder (hashing by default); the ``vector`` store persists the
  embeddings and refuses an encoder of another dimension.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from zoo.agents.memory_interface import (
    MemoryItem,
    MemoryItemType,
    MemoryProvider,
    MemoryRequest,
    MemoryResponse,
    MemoryStatus,
    TrajectoryData,
)
from zoo.errors import ConfigError, ZooError
from zoo.memory.distill import ENCODINGS, encode
from zoo.text.encoders import SentenceEncoder, load_encoder
from zoo.text.retrieval import BM25Retriever, DenseRetriever, HybridRetriever, rank_top_k

STORES = ("list", "vector", "graph")
RETRIEVERS = ("recency", "bm25", "cosine", "hybrid")
MANAGERS = ("none", "dedup", "decay", "consolidate")
MODULES = {"encode": ENCODINGS, "store": STORES, "retrieve": RETRIEVERS, "manage": MANAGERS}
PHASES = tuple(s.value for s in MemoryStatus)
STORE_FORMAT = "zoo.memory.store/1"


class StoreError(ZooError, ValueError):
    """A memory store directory that cannot be used (corrupt, foreign, or built for another embedder)."""


@dataclass(frozen=True)
class Genotype:
    """One memory architecture: a choice per module plus its parameters.

    Attributes:
        encode, store, retrieve, manage: the module choices (see the module table).
        top_k: items per request (EvolveLab default 3).
        alpha: dense weight of ``hybrid`` (``alpha * cosine + (1 - alpha) * bm25``).
        phases: statuses the system answers (``["begin"]``: BEGIN-only, like Agent-KB / AWM).
        decay_tau: ``decay`` time constant in ingested trajectories.
        consolidate_every: ``consolidate`` period in ingested trajectories.
        name: a label (a released baseline's name, or the id the evolution gave it).
    """

    encode: str = "insight"
    store: str = "list"
    retrieve: str = "bm25"
    manage: str = "dedup"
    top_k: int = 3
    alpha: float = 0.5
    phases: tuple[str, ...] = ("begin", "in")
    decay_tau: float = 20.0
    consolidate_every: int = 5
    name: str = ""

    def __post_init__(self) -> None:
        for module, choices in MODULES.items():
            if getattr(self, module) not in choices:
                raise ConfigError(f"memory.{module}={getattr(self, module)!r}; choose one of {list(choices)}")
        if int(self.top_k) < 1:
            raise ConfigError(f"memory.top_k must be >= 1, got {self.top_k}")
        if not 0.0 <= float(self.alpha) <= 1.0:
            raise ConfigError(f"memory.alpha must be in [0, 1], got {self.alpha}")
        phases = tuple(str(p).lower() for p in self.phases)
        if not phases or any(p not in PHASES for p in phases):
            raise ConfigError(f"memory.phases={list(self.phases)}; use a non-empty subset of {list(PHASES)}")
        if float(self.decay_tau) <= 0 or int(self.consolidate_every) < 1:
            raise ConfigError("memory.decay_tau must be > 0 and memory.consolidate_every >= 1")
        object.__setattr__(self, "phases", phases)
        object.__setattr__(self, "top_k", int(self.top_k))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Genotype:
        """From a config mapping (unknown keys such as ``_target_``, ``source`` or ``store_dir`` are ignored)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in dict(config).items() if k in names}
        if "phases" in values:
            values["phases"] = tuple(values["phases"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["phases"] = list(self.phases)
        return data

    def describe(self) -> str:
        """``encode/store/retrieve(+alpha)/manage/k`` -- a compact readable id."""
        retrieve = f"hybrid{self.alpha:g}" if self.retrieve == "hybrid" else self.retrieve
        manage = {"decay": f"decay{self.decay_tau:g}", "consolidate": f"consolidate{self.consolidate_every}"}
        phases = "" if len(self.phases) == len(PHASES) else "/" + "+".join(self.phases)
        return f"{self.encode}/{self.store}/{retrieve}/{manage.get(self.manage, self.manage)}/k{self.top_k}{phases}"

    def mutate(self, **changes: Any) -> Genotype:
        return replace(self, **changes)


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


class MemoryStore:
    """The persistent store directory of one memory system.

    Files: ``manifest.json`` (format tag, genotype, encoder name and dimension), ``items.jsonl`` (every item ever
    stored, active or not), ``vectors.pt`` (vector store: one embedding per item, row ``i`` = item ``i``). Writes go
    to a temporary file and are renamed into place, so an interrupted write never corrupts a store.
    """

    def __init__(self, directory: str | Path, genotype: Genotype, encoder: SentenceEncoder | None) -> None:
        self.directory = Path(directory)
        self.genotype = genotype
        self.encoder = encoder
        self.items: list[dict[str, Any]] = []
        self.vectors = torch.zeros(0, encoder.dim if encoder is not None else 0)
        self.ingests = 0

    @property
    def manifest_path(self) -> Path:
        return self.directory / "manifest.json"

    def open(self) -> None:
        """Load the store, or create it when the directory is missing or empty; a foreign directory is an error."""
        if not self.directory.exists() or not any(self.directory.iterdir()):
            self.directory.mkdir(parents=True, exist_ok=True)
            self.save()
            return
        if not self.manifest_path.is_file():
            raise StoreError(
                f"{self.directory} is not empty and has no manifest.json: not a memory store (pick an empty or new "
                "memory.store_dir)"
            )
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise StoreError(f"{self.manifest_path}: corrupt manifest ({err}); delete the store directory") from err
        if not isinstance(manifest, dict) or manifest.get("format") != STORE_FORMAT:
            raise StoreError(
                f"{self.manifest_path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r} "
                f"is not {STORE_FORMAT!r} (a foreign directory?)"
            )
        stored = Genotype.from_config(manifest.get("genotype", {}))
        if (stored.encode, stored.store) != (self.genotype.encode, self.genotype.store):
            raise StoreError(
                f"{self.directory} holds a {stored.encode}/{stored.store} store, but this system is "
                f"{self.genotype.encode}/{self.genotype.store}; use another memory.store_dir"
            )
        if self.genotype.store == "vector" and self.encoder is not None and manifest.get("dim") != self.encoder.dim:
            raise StoreError(
                f"{self.directory}: the store's vectors are {manifest.get('dim')}-dimensional "
                f"({manifest.get('encoder')}), but encoder {self.encoder.name!r} gives {self.encoder.dim}; use the "
                "same memory.encoder or a new store"
            )
        self.ingests = int(manifest.get("ingests", 0))
        self.items = []
        path = self.directory / "items.jsonl"
        for number, line in enumerate(path.read_text().splitlines() if path.is_file() else [], start=1):
            try:
                item = json.loads(line)
                item["id"], item["content"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise StoreError(f"{path}, line {number}: not a memory item ({err})") from err
            self.items.append(item)
        if self.genotype.store == "vector":
            vectors_path = self.directory / "vectors.pt"
            self.vectors = torch.load(vectors_path, weights_only=True) if vectors_path.is_file() else self.vectors
            if self.vectors.shape[0] != len(self.items):
                raise StoreError(
                    f"{vectors_path}: {self.vectors.shape[0]} vectors for {len(self.items)} items; the store is corrupt"
                )

    def save(self) -> None:
        manifest = {
            "format": STORE_FORMAT,
            "genotype": self.genotype.to_dict(),
            "encoder": getattr(self.encoder, "name", None),
            "dim": getattr(self.encoder, "dim", None),
            "ingests": self.ingests,
        }
        self._write(self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
        self._write(self.directory / "items.jsonl", "".join(json.dumps(i, sort_keys=True) + "\n" for i in self.items))
        if self.genotype.store == "vector":
            tmp = self.directory / "vectors.pt.tmp"
            torch.save(self.vectors, tmp)
            os.replace(tmp, self.directory / "vectors.pt")

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def add(self, item: dict[str, Any]) -> dict[str, Any]:
        item = {"id": f"m{len(self.items):05d}", "count": 1, "superseded_by": None, "consolidated_into": None, **item}
        if self.genotype.store == "graph":
            item["edges"] = [o["id"] for o in self.active() if o.get("group") == item.get("group")]
            for other in self.active():
                if other["id"] in item["edges"]:
                    other.setdefault("edges", []).append(item["id"])
        if self.genotype.store == "vector" and self.encoder is not None:
            self.vectors = torch.cat([self.vectors, self.encoder.encode([item["content"]]).float()])
        self.items.append(item)
        return item

    def active(self) -> list[dict[str, Any]]:
        return [i for i in self.items if i["superseded_by"] is None and i["consolidated_into"] is None]


class ModularMemory(MemoryProvider):
    """A memory system for any :class:`Genotype`, persisted in ``store_dir`` (EvolveLab interface).

    Args:
        genotype: the architecture (or pass its fields as keyword arguments, as a Hydra config does).
        store_dir: this system's own directory (created when missing; reopened with its items when present).
        encoder: sentence-encoder spec for dense scoring (``hashing`` default, ``minilm``, a local directory).
        index: dense search, ``exact`` (default) or ``faiss`` (:class:`zoo.text.retrieval.DenseRetriever`; the same
            ranking through FAISS's flat index, ``pip install 'paperzoo[retrieval]'``).
    """

    def __init__(
        self,
        genotype: Genotype | None = None,
        store_dir: str | Path = "memory_store",
        encoder: str | SentenceEncoder = "hashing",
        index: str = "exact",
        **genotype_fields: Any,
    ) -> None:
        if genotype is None:
            genotype = Genotype.from_config(genotype_fields)
        elif genotype_fields:
            genotype = genotype.mutate(**genotype_fields)
        self.genotype = genotype
        self.memory_type = genotype.name or genotype.describe()
        self.encoder = load_encoder(encoder) if isinstance(encoder, str) else encoder
        if index not in ("exact", "faiss"):
            raise ConfigError(f"memory.index must be 'exact' or 'faiss', got {index!r}")
        self.index = index
        needs_encoder = genotype.store == "vector" or genotype.retrieve in ("cosine", "hybrid")
        self.store = MemoryStore(store_dir, genotype, self.encoder if needs_encoder else None)
        self.stats = {"provides": 0, "provided_items": 0, "provided_chars": 0, "dedup_hits": 0, "superseded": 0}
        self._ready = False

    def initialize(self) -> bool:
        if not self._ready:
            self.store.open()
            self._ready = True
        return True

    # -- Retrieve ---------------------------------------------------------------------------------------------------
    def scores(self, query: str, items: list[dict[str, Any]]) -> torch.Tensor:
        """Relevance of every active item to ``query`` under the Retrieve (and ``decay``) choice."""
        g = self.genotype
        texts = [i["content"] for i in items]
        if g.retrieve == "recency":
            out = torch.tensor([float(i["created"]) + 1.0 for i in items]) / (self.store.ingests + 1.0)
        elif g.retrieve == "bm25":
            bm25 = BM25Retriever()
            bm25.add(texts)
            out = bm25.scores(query)
        else:
            dense = DenseRetriever(self.encoder, index=self.index)
            if g.store == "vector":
                index = {item["id"]: row for row, item in enumerate(self.store.items)}
                dense.add_vectors(self.store.vectors[[index[i["id"]] for i in items]])
            else:
                dense.add(texts)
            if g.retrieve == "cosine":
                out = dense.scores(query)
            else:
                bm25 = BM25Retriever()
                bm25.add(texts)
                out = HybridRetriever(dense, bm25, alpha=g.alpha).scores(query)
        if g.manage == "decay":
            span = out.max() - out.min()
            relevance = torch.ones_like(out) if span <= 0 else (out - out.min()) / span
            ages = torch.tensor([float(self.store.ingests - i["created"]) for i in items])
            out = relevance * torch.exp(-ages / g.decay_tau)
        return out.float()

    def provide_memory(self, request: MemoryRequest) -> MemoryResponse:
        self.initialize()
        status = MemoryStatus(request.status).value
        items = self.store.active()
        if status not in self.genotype.phases or not items:
            return MemoryResponse([], self.memory_type, len(items))
        query = f"{request.query} {request.context}".strip()
        scores = self.scores(query, items)
        k = self.genotype.top_k
        if self.genotype.store == "graph":
            chosen = self._graph_expand(items, scores, k)
        else:
            chosen = rank_top_k(scores, k)
        memories = [self._item(items[i], score) for i, score in chosen]
        response = MemoryResponse(memories, self.memory_type, len(items))
        self.stats["provides"] += 1
        self.stats["provided_items"] += len(memories)
        self.stats["provided_chars"] += response.characters
        return response

    def _graph_expand(self, items: list[dict[str, Any]], scores: torch.Tensor, k: int) -> list[tuple[int, float]]:
        ranked = rank_top_k(scores, len(items))
        seeds = ranked[: math.ceil(k / 2)]
        chosen = {i for i, _ in seeds}
        neighbours = {n for i, _ in seeds for n in items[i].get("edges", [])}
        for i, _ in ranked:
            if len(chosen) >= k:
                break
            if items[i]["id"] in neighbours:
                chosen.add(i)
        for i, _ in ranked:
            if len(chosen) >= k:
                break
            chosen.add(i)
        return sorted(((i, float(scores[i])) for i in chosen), key=lambda p: (-p[1], p[0]))

    def _item(self, item: dict[str, Any], score: float) -> MemoryItem:
        kind = MemoryItemType.API if item.get("kind") == "skill" else MemoryItemType.TEXT
        metadata = {k: item.get(k) for k in ("kind", "key", "group", "facts", "count", "created")}
        return MemoryItem(item["id"], item["content"], metadata, score, kind)

    # -- Encode + Manage ------------------------------------------------------------------------------------------
    def take_in_memory(self, trajectory: TrajectoryData) -> tuple[bool, str]:
        self.initialize()
        g = self.genotype
        units = encode(g.encode, trajectory)
        added = deduped = superseded = 0
        for unit in units:
            active = self.store.active()
            if g.manage != "none":
                same = next((i for i in active if _normalise(i["content"]) == _normalise(unit.text)), None)
                if same is not None:
                    same["count"] += 1
                    deduped += 1
                    continue
            item = self.store.add(
                {
                    "content": unit.text,
                    "kind": unit.kind,
                    "key": unit.key,
                    "group": unit.group,
                    "facts": unit.facts,
                    "created": self.store.ingests,
                }
            )
            added += 1
            if g.manage != "none" and unit.key is not None:
                for old in active:
                    if old.get("key") == unit.key:
                        old["superseded_by"] = item["id"]
                        superseded += 1
        self.store.ingests += 1
        consolidated = 0
        if g.manage == "consolidate" and self.store.ingests % g.consolidate_every == 0:
            consolidated = self._consolidate()
        self.store.save()
        self.stats["dedup_hits"] += deduped
        self.stats["superseded"] += superseded
        return True, f"{added} added, {deduped} duplicates, {superseded} superseded, {consolidated} consolidated"

    def _consolidate(self) -> int:
        groups: dict[str, list[dict[str, Any]]] = {}
        for item in self.store.active():
            if item.get("kind") in ("insight", "skill", "consolidated") and item.get("group"):
                groups.setdefault(item["group"], []).append(item)
        merged = 0
        for group, members in groups.items():
            if len(members) < 2:
                continue
            facts: dict[str, dict[str, Any]] = {}
            for member in members:
                for fact in member.get("facts", []):
                    facts[json.dumps({k: v for k, v in fact.items() if k in ("type", "index")}, sort_keys=True)] = fact
            lines = list(dict.fromkeys(line for m in members for line in m["content"].splitlines()))
            new = self.store.add(
                {
                    "content": f"Consolidated notes on {group}:\n" + "\n".join(lines),
                    "kind": "consolidated",
                    "key": f"{group}/consolidated",
                    "group": group,
                    "facts": list(facts.values()),
                    "created": self.store.ingests,
                    "consolidated_from": [m["id"] for m in members],
                }
            )
            for member in members:
                member["consolidated_into"] = new["id"]
            merged += 1
        return merged


def build_memory(store_dir: str, encoder: str = "hashing", index: str = "exact", **config: Any) -> MemoryProvider:
    """Hydra entry: ``memory`` config node -> a :class:`ModularMemory` (``encode: none`` -> no memory)."""
    from zoo.agents.memory_interface import NoMemory

    if config.get("encode") == "none":
        return NoMemory()
    return ModularMemory(Genotype.from_config(config), store_dir=store_dir, encoder=encoder, index=index)
