"""Image + text reasoning rows: pixel values, tokenized text with image placeholders, step segments."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from zoo.answers import STEP_DELIMITER, split_steps
from zoo.data.samplers import TrainSampler
from zoo.data.sources import Row, RowSource
from zoo.datamodules.base import IGNORE_INDEX, RowDataModule
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import DataError
from zoo.tokens import EOS, THINK_CLOSE, THINK_OPEN


def load_image(value: Any, where: str) -> np.ndarray:
    """An image as a ``[H, W, C]`` array: a numpy array / tensor / nested list, or a path to ``.npy`` or an image."""
    if value is None:
        raise DataError(f"{where}: missing image (the prompt has an image placeholder but the row has no image)")
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.is_file():
            raise DataError(f"{where}: image file not found: {path}")
        if path.suffix == ".npy":
            return np.load(path)
        from PIL import Image

        return np.asarray(Image.open(path).convert("RGB"))
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class VisualReasoningDataModule(RowDataModule):
    """Rows with images (``prompt`` containing ``<image>`` placeholders, ``completion``, ``image``/``images``).

    Each ``<image>`` in the prompt stands for one image and is expanded to ``num_image_tokens`` copies of
    the image token (what LLaVA's processor does). Images are ``[H, W, 3]`` uint8 (or float in [0, 1]),
    ``image_size`` square; they are scaled to [0, 1] and normalized with ``image_mean``/``image_std``.

    Batch (contract):

    - ``input_ids``, ``attention_mask``, ``labels`` ``[B, T]``: the plain CoT sequence, right-padded, loss on
      the completion only;
    - ``pixel_values`` ``[num_images, 3, H, W]`` (images of all rows, in row order);
    - ``prompt_ids``, ``prompt_attention_mask`` ``[B, P]`` left-padded prompts (generation);
    - ``segments``: per row a dict of token-id lists ``prompt`` (incl. BOS and image tokens), ``head``
      (``<think>``), ``steps`` (one list per reasoning step, delimiter included) and ``tail``
      (``</think>`` answer EOS) -- what the VaLR rewrite consumes;
    - ``prompts``, ``answers`` (strings), ``num_steps`` ``[B]``, and ``meta`` (per-row extra columns:
      ``cells`` etc. when present).

    Raises:
        DataError: naming the split and row index for a wrong image size or channel count, a missing image,
            or a placeholder count that does not match the number of images.
    """

    required_fields = ("prompt", "completion")

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        source: RowSource,
        image_size: int | None = 32,
        num_image_tokens: int | None = 16,
        image_token: str = "<image>",
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
        meta_fields: Sequence[str] = ("cells", "query_rows", "query_color", "op"),
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        max_length: int = 512,
        num_workers: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        sampler: TrainSampler | None = None,
    ) -> None:
        super().__init__(
            tokenizer, source, batch_size, eval_batch_size, max_length, num_workers, seed, shuffle, sampler
        )
        # None (e.g. backbone=hf_vlm reading the checkpoint) falls back to the tiny geometry; the module checks
        # the pixel size against the vision tower on the first batch
        self.image_size = int(image_size or 32)
        self.num_image_tokens = int(num_image_tokens or 16)
        self.image_token = image_token
        if image_token not in tokenizer.get_vocab():
            raise DataError(f"the tokenizer has no image token {image_token!r}; use a VLM backbone (backbone=tiny_vlm)")
        self.image_mean = np.asarray(image_mean, dtype=np.float32).reshape(3, 1, 1)
        self.image_std = np.asarray(image_std, dtype=np.float32).reshape(3, 1, 1)
        self.meta_fields = tuple(meta_fields)

    # -- encoding -------------------------------------------------------------------------------------------------
    def pixels(self, image: np.ndarray, where: str) -> torch.Tensor:
        """Validate one ``[H, W, 3]`` image and return normalized ``[3, H, W]`` float32 pixels."""
        if image.ndim != 3 or image.shape[-1] != 3:
            raise DataError(
                f"{where}: image has shape {tuple(image.shape)}; expected [H, W, 3] (RGB, channels last, "
                f"{self.image_size}x{self.image_size})"
            )
        if image.shape[0] != self.image_size or image.shape[1] != self.image_size:
            raise DataError(
                f"{where}: image is {image.shape[0]}x{image.shape[1]} but the vision tower takes "
                f"{self.image_size}x{self.image_size} (datamodule.image_size); resize the image"
            )
        x = image.astype(np.float32)
        if image.dtype == np.uint8 or x.max() > 1.0:
            x = x / 255.0
        x = (x.transpose(2, 0, 1) - self.image_mean) / self.image_std
        return torch.from_numpy(np.ascontiguousarray(x))

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        where = f"{split} row {index}"
        prompt = row["prompt"]
        raw_images = row.get("images")
        if raw_images is None:
            raw_images = [row["image"]] if row.get("image") is not None else []
        placeholders = prompt.count(self.image_token)
        if placeholders and not raw_images:
            raise DataError(
                f"{where}: missing image: the prompt has {placeholders} {self.image_token} placeholder(s) but the "
                "row has no 'image'/'images' field"
            )
        if placeholders != len(raw_images):
            raise DataError(
                f"{where}: the prompt has {placeholders} {self.image_token} placeholder(s) but the row has "
                f"{len(raw_images)} image(s); they must match one to one"
            )
        pixels = [
            self.pixels(load_image(img, f"{where} image {j}"), f"{where} image {j}") for j, img in enumerate(raw_images)
        ]
        expanded = prompt.replace(self.image_token, self.image_token * self.num_image_tokens)
        prompt_ids = encode_prompt(self.tokenizer, expanded)
        completion = row["completion"]
        steps = list(row["steps"]) if row.get("steps") is not None else split_steps(completion)
        step_texts = [s + (STEP_DELIMITER if i < len(steps) - 1 else "") for i, s in enumerate(steps)]
        has_think = THINK_OPEN in completion
        answer = str(row.get("answer", completion.rsplit(THINK_CLOSE, 1)[-1] if has_think else completion))
        head = self._ids(THINK_OPEN) if has_think else []
        step_ids = [self._ids(s) for s in step_texts] if has_think else []
        tail_text = completion.rsplit(THINK_CLOSE, 1)[-1] if has_think else completion
        tail = (self._ids(THINK_CLOSE) if has_think else []) + self._ids(tail_text)
        tail = tail + [self.tokenizer.eos_token_id] if not tail_text.endswith(EOS) else tail
        completion_ids = head + [t for s in step_ids for t in s] + tail
        self.check_length(
            split, index, len(prompt_ids) + len(completion_ids), "prompt (with image tokens) + completion"
        )
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "segments": {"prompt": prompt_ids, "head": head, "steps": step_ids, "tail": tail},
            "pixel_values": pixels,
            "prompt": prompt,
            "answer": answer.strip(),
            "num_steps": len(step_ids),
            "meta": {k: row[k] for k in self.meta_fields if k in row},
        }

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.pad_token_id
        full = [it["prompt_ids"] + it["completion_ids"] for it in items]
        labels = [[IGNORE_INDEX] * len(it["prompt_ids"]) + it["completion_ids"] for it in items]
        pixels = [p for it in items for p in it["pixel_values"]]
        meta_keys = sorted({k for it in items for k in it["meta"]})
        return {
            "input_ids": pad_sequences(full, pad, "right"),
            "attention_mask": pad_sequences([[1] * len(f) for f in full], 0, "right"),
            "labels": pad_sequences(labels, IGNORE_INDEX, "right"),
            "pixel_values": torch.stack(pixels) if pixels else None,
            "prompt_ids": pad_sequences([it["prompt_ids"] for it in items], pad, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(it["prompt_ids"]) for it in items], 0, "left"),
            "segments": [it["segments"] for it in items],
            "prompts": [it["prompt"] for it in items],
            "answers": [it["answer"] for it in items],
            "num_steps": torch.tensor([it["num_steps"] for it in items], dtype=torch.long),
            "meta": {k: [it["meta"].get(k) for it in items] for k in meta_keys},
        }


__all__ = ["VisualReasoningDataModule", "load_image"]
