"""Synthetic visual reasoning: coloured shapes in a grid, multi-step counting questions with exact answers.

An image is a ``grid x grid`` board of ``cell x cell`` pixel cells (numpy raster, no torchvision); each cell
is empty or holds one shape (square, circle, cross, ...) in one colour. A question asks about several rows;
each reasoning step is one *visual look-up* (count a colour in one row) followed by an arithmetic update::

    <image>
    sum of red in rows 1 3 4?
    -> <think>row1 red 2 sum 2\nrow3 red 1 sum 3\nrow4 red 0 sum 3</think>3

``filler=n`` appends ``n`` recap clauses to every step (``row1 red 2 sum 2, red so far 2, rows left 3 4, ...``):
text-only reasoning between two look-ups that puts the image and the earlier look-ups far back in the sequence
(visual dilution); the clauses are determined by the question and the running state, so they are learnable.
``op="max"`` asks which of the rows has the most shapes of a colour (ties: the first), with steps
``row1 red 2 best 1``. The number of steps (rows looked up) is the difficulty knob. Everything is drawn
deterministically from a seed. Rows carry ``image`` (uint8 ``[H, W, 3]``), ``steps`` (the step texts),
``num_steps`` and ``cells`` (``[grid*grid, 2]`` colour/shape index per cell, -1 = empty; probe targets).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from zoo.answers import format_reasoning
from zoo.data.sources import GeneratedSource, Row
from zoo.data.tasks import Example, Task

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 80, 235),
    "yellow": (235, 220, 40),
    "purple": (160, 60, 200),
}
SHAPES: tuple[str, ...] = ("square", "circle", "cross", "triangle")


def shape_mask(shape: str, size: int) -> np.ndarray:
    """Boolean ``[size, size]`` mask of a shape drawn inside a cell (1-pixel margin)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    c = (size - 1) / 2.0
    r = size / 2.0 - 1.0
    if shape == "square":
        return (np.abs(yy - c) <= r - 0.5) & (np.abs(xx - c) <= r - 0.5)
    if shape == "circle":
        return (yy - c) ** 2 + (xx - c) ** 2 <= r * r
    if shape == "cross":
        inside = (np.abs(yy - c) <= r) & (np.abs(xx - c) <= r)
        return inside & ((np.abs(yy - c) <= 0.75) | (np.abs(xx - c) <= 0.75))
    if shape == "triangle":
        top, bottom = c - r, c + r
        half = (yy - top) / max(bottom - top, 1e-6) * r
        return (yy >= top) & (yy <= bottom) & (np.abs(xx - c) <= half)
    raise ValueError(f"unknown shape {shape!r}; use one of {SHAPES}")


def draw_grid(cells: np.ndarray, grid: int, cell: int, colors: Sequence[str], shapes: Sequence[str]) -> np.ndarray:
    """Raster a board. ``cells``: ``[grid*grid, 2]`` (colour index, shape index; -1 = empty) -> uint8 ``[H, W, 3]``."""
    image = np.zeros((grid * cell, grid * cell, 3), dtype=np.uint8)
    masks = {s: shape_mask(s, cell) for s in shapes}
    for index, (color, shape) in enumerate(cells.tolist()):
        if color < 0:
            continue
        r, c = divmod(index, grid)
        patch = image[r * cell : (r + 1) * cell, c * cell : (c + 1) * cell]
        patch[masks[shapes[shape]]] = COLORS[colors[color]]
    return image


class VisualCounting(Task):
    """Multi-step visual counting over rows of a shape grid.

    Args:
        grid: cells per side (the image is ``grid * cell`` pixels square).
        cell: pixels per cell side (use the vision tower's patch size: one cell per patch).
        min_steps, max_steps: number of rows looked up (reasoning steps); the difficulty knob.
        fill_prob: probability that a cell holds a shape.
        colors, shapes: the attribute vocabularies (names from :data:`COLORS`, :data:`SHAPES`).
        ops: question kinds drawn uniformly (``sum`` and/or ``max``).
        filler: recap clauses appended to every step (0 = the bare look-up); each adds about 30 characters of
            text-only reasoning between look-ups (:meth:`recap`).
    """

    name = "visual_counting"

    def __init__(
        self,
        grid: int = 4,
        cell: int = 8,
        min_steps: int = 1,
        max_steps: int = 4,
        fill_prob: float = 0.6,
        colors: Sequence[str] = ("red", "green", "blue"),
        shapes: Sequence[str] = ("square", "circle", "cross"),
        ops: Sequence[str] = ("sum",),
        filler: int = 0,
    ) -> None:
        if not 1 <= min_steps <= max_steps <= grid:
            raise ValueError(f"need 1 <= min_steps <= max_steps <= grid, got {min_steps}, {max_steps}, {grid}")
        unknown = [c for c in colors if c not in COLORS] + [s for s in shapes if s not in SHAPES]
        if unknown:
            raise ValueError(f"unknown colours/shapes {unknown}; colours {list(COLORS)}, shapes {list(SHAPES)}")
        if not set(ops) <= {"sum", "max"} or not ops:
            raise ValueError(f"ops must be a non-empty subset of ['sum', 'max'], got {list(ops)}")
        if filler < 0:
            raise ValueError(f"filler must be >= 0 recap clauses per step, got {filler}")
        self.filler = filler
        self.grid, self.cell = grid, cell
        self.min_steps, self.max_steps = min_steps, max_steps
        self.fill_prob = fill_prob
        self.colors, self.shapes, self.ops = tuple(colors), tuple(shapes), tuple(ops)

    def sample_cells(self, rng: random.Random) -> np.ndarray:
        """``[grid*grid, 2]`` colour/shape indices (-1 = empty)."""
        cells = np.full((self.grid * self.grid, 2), -1, dtype=np.int64)
        for i in range(self.grid * self.grid):
            if rng.random() < self.fill_prob:
                cells[i] = (rng.randrange(len(self.colors)), rng.randrange(len(self.shapes)))
        return cells

    def recap(self, name: str, state: str, value: int, left: Sequence[int]) -> str:
        """The ``filler`` recap clauses after a look-up: ``", red so far 3, rows left 2 4"`` repeated (``state`` is
        ``so far`` for a sum, ``best row`` for a max; ``left``: the 0-based rows still to look up)."""
        rows = " ".join(str(r + 1) for r in left) or "none"
        return f", {name} {state} {value}, rows left {rows}" * self.filler

    def sample(self, rng: random.Random) -> Example:
        cells = self.sample_cells(rng)
        n = rng.randint(self.min_steps, self.max_steps)
        rows = sorted(rng.sample(range(self.grid), n))
        color = rng.randrange(len(self.colors))
        name = self.colors[color]
        op = rng.choice(self.ops)
        counts = [int((cells[r * self.grid : (r + 1) * self.grid, 0] == color).sum()) for r in rows]
        row_list = " ".join(str(r + 1) for r in rows)
        steps: list[str] = []
        if op == "sum":
            question = f"sum of {name} in rows {row_list}?"
            total = 0
            for i, (r, k) in enumerate(zip(rows, counts)):
                total += k
                steps.append(f"row{r + 1} {name} {k} sum {total}" + self.recap(name, "so far", total, rows[i + 1 :]))
            answer = str(total)
        else:
            question = f"most {name}: rows {row_list}?"
            best, best_k = rows[0], -1
            for i, (r, k) in enumerate(zip(rows, counts)):
                if k > best_k:
                    best, best_k = r, k
                steps.append(
                    f"row{r + 1} {name} {k} best {best + 1}" + self.recap(name, "best row", best + 1, rows[i + 1 :])
                )
            answer = str(best + 1)
        image = draw_grid(cells, self.grid, self.cell, self.colors, self.shapes)
        meta: dict[str, Any] = {
            "image": image,
            "steps": steps,
            "num_steps": n,
            "cells": cells,
            "query_rows": rows,
            "query_color": color,
            "op": op,
        }
        return Example(f"<image>\n{question}", format_reasoning(steps, answer), answer, meta)


class VisualSource(GeneratedSource):
    """Rows of a visual task; splits are drawn from disjoint seeds (``seed``, ``seed+1``, ``seed+2``).

    Prompts repeat across images (the question text alone does not identify a sample), so unlike
    :class:`~zoo.data.sources.TaskSource` no prompt-level exclusion is done.
    """

    def __init__(self, task: Task, num_train: int = 8000, num_val: int = 128, num_test: int = 256, seed: int = 0):
        super().__init__(num_train, num_val, num_test, seed)
        self.task = task

    def split_seed(self, split: str) -> int:
        return self.seed + {"train": 0, "val": 1_000_003, "test": 2_000_003}[split]

    def generate(self, split: str, size: int) -> list[Row]:
        rng = random.Random(self.split_seed(split))
        return [self.task.sample(rng).as_row() for _ in range(size)]

    def describe(self) -> dict[str, Any]:
        return {"kind": "visual", "task": self.task.describe(), "sizes": self.sizes, "seed": self.seed}


__all__ = ["COLORS", "SHAPES", "VisualCounting", "VisualSource", "draw_grid", "shape_mask"]
