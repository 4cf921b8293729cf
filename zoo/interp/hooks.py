"""Forward-hook context managers: read the residual stream, steer it, scale or patch attention heads.

Each hook is a context manager over a Hugging Face causal LM: it registers PyTorch hooks on ``__enter__`` and
removes them on ``__exit__`` (also when the body raises), so nothing leaks into later forwards. Hooks fire at
every forward call, so they act at every step of a KV-cached decode (the prefill and each one-token step) as
well as on a full forward; per-position edits therefore give the same outputs with and without the cache.
A hook object can be entered again after it exits (not while it is active).

* :class:`ActivationCache` -- record the residual stream after decoder layers (``site="residual"``) or the
  per-head attention outputs consumed by the output projection (``site="heads"``, ``[B, T, H, d_head]``).
* :class:`ResidualSteerer` -- ``h_l <- h_l + alpha * v`` at the chosen positions (``all``, ``prompt``, ``generated``,
  ``from_step:k``; never padding) of the output of layer ``l``.
* :class:`HeadScaler` -- multiply head ``h`` of layer ``l`` by a scale: a pre-hook on the attention output
  projection scales that head's slice ``[h * d_head, (h + 1) * d_head)`` of its input (query heads under
  GQA); with a ``gate`` callable the factor is ``1 + (scale - 1) * g`` for a step-dependent ``g``.
* :class:`HeadPatcher` -- replace heads' slices at one position with given values (activation patching).
* :func:`activations_at` / :func:`collect_activations` -- activations of a batch / of text prompts at one
  position, computed in chunks.

Where the hooks attach comes from :func:`zoo.interp.architectures.model_layout`; all indices and widths are
checked when the hook is built, before any forward pass.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from typing import Any, Literal

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.interp.architectures import ModelLayout, model_layout, unwrap_model

Head = tuple[int, int]
Gate = Callable[[int], "float | torch.Tensor"]
Site = Literal["residual", "heads"]


def hidden_of(output: Any) -> torch.Tensor:
    """The hidden states of a decoder layer's output (a tensor, or the first item of a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def _replace_hidden(output: Any, hidden: torch.Tensor) -> Any:
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


class ModelHook(ABC):
    """Base of the hook context managers: registers on enter, removes everything on exit.

    Subclasses implement :meth:`_attach`, registering hooks and pushing their removal onto ``stack``.

    Args:
        model: a causal LM whose architecture is in the registry (PEFT wrappers are unwrapped).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layout: ModelLayout = model_layout(model)
        self._stack: ExitStack | None = None

    @property
    def active(self) -> bool:
        """Whether the hooks are registered (inside the ``with`` block)."""
        return self._stack is not None

    def __enter__(self) -> ModelHook:
        if self._stack is not None:
            raise RuntimeError(f"{type(self).__name__} is already active; exit it before entering it again")
        stack = ExitStack()
        try:
            self._attach(stack)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    @abstractmethod
    def _attach(self, stack: ExitStack) -> None:
        """Register the hooks; push each removal (``stack.callback(handle.remove)``) or child context."""


def _check_layers(layout: ModelLayout, layers: Sequence[int]) -> list[int]:
    layers = list(layers)
    if not layers:
        raise ConfigError("layers is empty: name at least one decoder layer")
    for layer in layers:
        layout.check_layer(layer)
    if len(set(layers)) != len(layers):
        raise ConfigError(f"layers {layers} repeats an index")
    return layers


class ActivationCache(ModelHook):
    """Record activations of some layers at every forward call while active.

    ``site="residual"``: the residual stream after decoder layer ``l`` (the layer's output), ``[B, T, d]`` per
    call. ``site="heads"``: the input the attention output projection of layer ``l`` actually consumed (after any
    pre-hook such as :class:`HeadScaler`), reshaped to per-head outputs ``[B, T, H, d_head]``.

    During KV-cached generation each decode step is one call with ``T`` = the number of new tokens (1), so
    :meth:`chunks` holds the prefill followed by one chunk per step; ``cache[layer]`` concatenates them along
    positions. Entering the context clears earlier records. Tensors are detached.

    Args:
        model: the causal LM.
        layers: decoder-layer indices to record.
        site: ``"residual"`` or ``"heads"``.
        device: where to move recorded tensors (``None``: leave them where they are).
    """

    def __init__(
        self, model: nn.Module, layers: Sequence[int], site: Site = "residual", device: str | None = None
    ) -> None:
        super().__init__(model)
        if site not in ("residual", "heads"):
            raise ConfigError(f"site={site!r}: use 'residual' (decoder-layer outputs) or 'heads' (per-head outputs)")
        self.layers = _check_layers(self.layout, layers)
        self.site = site
        self.device = device
        self.records: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.layers}

    def clear(self) -> None:
        """Drop the recorded tensors."""
        self.records = {layer: [] for layer in self.layers}

    def _attach(self, stack: ExitStack) -> None:
        self.clear()
        for layer in self.layers:
            if self.site == "residual":
                handle = self.layout.layers[layer].register_forward_hook(partial(self._record_residual, layer))
            else:
                handle = self.layout.attn_out_projs[layer].register_forward_hook(
                    partial(self._record_heads, layer), with_kwargs=True
                )
            stack.callback(handle.remove)

    def _store(self, layer: int, value: torch.Tensor) -> None:
        value = value.detach()
        self.records[layer].append(value.to(self.device) if self.device is not None else value)

    def _record_residual(self, layer: int, module: nn.Module, args: tuple, output: Any) -> None:
        self._store(layer, hidden_of(output))

    def _record_heads(self, layer: int, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        x = args[0] if args else kwargs["input"]
        self._store(layer, x.reshape(*x.shape[:-1], self.layout.num_heads, self.layout.head_dim))

    def chunks(self, layer: int) -> list[torch.Tensor]:
        """The tensors recorded for ``layer``, one per forward call."""
        if layer not in self.records:
            raise KeyError(f"layer {layer} is not cached (cached layers: {self.layers})")
        return self.records[layer]

    def __getitem__(self, layer: int) -> torch.Tensor:
        """All calls of ``layer`` concatenated along positions: ``[B, T_total, ...]``."""
        chunks = self.chunks(layer)
        if not chunks:
            raise RuntimeError(f"nothing was recorded for layer {layer}: run the model inside the context")
        batch_sizes = {c.shape[0] for c in chunks}
        if len(batch_sizes) > 1:
            raise RuntimeError(
                f"layer {layer}: the batch size changed between calls ({sorted(batch_sizes)}; e.g. finished rows "
                "dropped from a decoding batch); read the calls one by one with .chunks(layer)"
            )
        return torch.cat(chunks, dim=1)


#: ``positions`` of :class:`ResidualSteerer`: every token, the prompt's, the generated ones, from generated token k on.
STEER_POSITIONS = ("all", "prompt", "generated", "from_step:<k>")


def parse_positions(positions: str) -> tuple[str, int]:
    """``"all" | "prompt" | "generated" | "from_step:k"`` -> ``(kind, k)`` (``generated`` is ``from_step:0``)."""
    text = str(positions).strip()
    if text in ("all", "prompt"):
        return text, 0
    if text == "generated":
        return "generated", 0
    if text.startswith("from_step:"):
        value = text.split(":", 1)[1]
        if value.isdigit():
            return "generated", int(value)
    raise ConfigError(f"positions={positions!r}: use one of {', '.join(STEER_POSITIONS)} (k an integer >= 0)")


def first_float_parameter(module: nn.Module) -> torch.Tensor | None:
    """The first floating-point parameter or buffer of ``module`` (where its activations live), else ``None``."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor
    return None


def layers_owner(model: nn.Module, layers: nn.ModuleList) -> nn.Module:
    """The module whose forward runs ``layers`` (e.g. ``LlamaModel``: it receives the 2-D ``attention_mask`` and the
    cache from every wrapper, PEFT's included, which call the language model's ``forward`` directly)."""
    base = unwrap_model(model)
    for module in base.modules():
        if any(child is layers for child in module.children()):
            return module
    return base


class ResidualSteerer(ModelHook):
    """Add ``alpha * vector`` to the residual stream after decoder layer ``layer``, at the chosen positions.

    ``h_l(t) <- h_l(t) + alpha * v`` for every chosen token ``t`` of every forward call -- a full forward or the
    prefill and every cached decode step. Steering along ``-v`` is ``alpha < 0``. Padding (positions whose 2-D
    ``attention_mask`` is 0: left padding, per-row padding of fed chunks, retracted tokens) is never steered.

    ``positions``:

    * ``all`` -- every non-padding position (prompt and generated tokens);
    * ``prompt`` -- the prompt's positions: the columns of the call that starts a sequence (no cache yet);
    * ``generated`` -- the positions of generated tokens (columns after the prompt's), whose residuals steer the
      tokens after them; the first generated token is sampled from the unsteered prompt;
    * ``from_step:k`` -- the generated tokens from the ``k``-th on (``from_step:0`` = ``generated``), counted per row
      over non-padding positions (so retracted tokens do not count).

    Which positions a call covers is read by a forward pre-hook on the module that runs the decoder layers (the 2-D
    ``attention_mask`` of width cache + new tokens that Hugging Face ``generate`` and the zoo's decoders pass, else
    the cache's length); a forward without any cache counts as the prompt. The shift ``alpha * v`` is cast to the
    layer's device and dtype once when the hook attaches (no host-to-device copy per call).

    Args:
        model: the causal LM.
        layer: decoder-layer index whose output is steered.
        vector: ``[hidden_size]`` steering direction (used as given: not normalised).
        alpha: steering strength.
        positions: which positions are steered (above); ``all`` by default.
    """

    def __init__(
        self, model: nn.Module, layer: int, vector: torch.Tensor, alpha: float, positions: str = "all"
    ) -> None:
        super().__init__(model)
        self.layer = self.layout.check_layer(layer)
        self.vector = self.layout.check_vector(vector, "steering vector").detach()
        if not math.isfinite(float(alpha)):
            raise ConfigError(f"alpha={alpha!r} must be a finite number")
        self.alpha = float(alpha)
        self.positions = str(positions)
        self._kind, self._from_step = parse_positions(positions)
        self._shift: torch.Tensor | None = None
        self._where: torch.Tensor | None = None  # [B, T, 1] 0/1 of the current call's positions (None: all)
        self._prompt_width = 0  # columns of the sequence's first call (the prompt)

    def _attach(self, stack: ExitStack) -> None:
        layer = self.layout.layers[self.layer]
        anchor = first_float_parameter(layer)
        shift = self.alpha * self.vector
        self._shift = shift if anchor is None else shift.to(device=anchor.device, dtype=anchor.dtype)
        self._where = None
        owner = layers_owner(self.model, self.layout.layers)
        stack.callback(owner.register_forward_pre_hook(self._read_positions, with_kwargs=True).remove)
        stack.callback(layer.register_forward_hook(self._steer).remove)

    def _read_positions(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        fed = kwargs.get("input_ids", args[0] if args else None)
        if fed is None:
            fed = kwargs.get("inputs_embeds")
        if fed is None:
            self._where = None
            return
        batch, width = fed.shape[0], fed.shape[1]
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] >= width:
            past = mask.shape[1] - width
        else:
            mask = None
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            past = int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else 0
        if past == 0:
            self._prompt_width = width
        if mask is None and self._kind == "all":
            self._where = None
            return
        full = mask if mask is not None else torch.ones(batch, past + width, dtype=torch.long, device=fed.device)
        attended = full != 0
        where = attended[:, past:]
        if self._kind == "prompt":
            where = where & (torch.arange(past, past + width, device=full.device) < self._prompt_width)
        elif self._kind == "generated":
            prompt_tokens = attended[:, : self._prompt_width].sum(-1, keepdim=True)
            index = attended.long().cumsum(-1)[:, past:] - 1 - prompt_tokens  # generated token index per row
            where = where & (index >= self._from_step)
        self._where = where[..., None]

    def _steer(self, module: nn.Module, args: tuple, output: Any) -> Any:
        hidden = hidden_of(output)
        if self._shift is None or self._shift.device != hidden.device or self._shift.dtype != hidden.dtype:
            self._shift = (self.alpha * self.vector).to(device=hidden.device, dtype=hidden.dtype)  # once, then kept
        where = self._where
        if where is None or where.shape[:2] != hidden.shape[:2]:
            return _replace_hidden(output, hidden + self._shift)
        return _replace_hidden(output, hidden + where.to(hidden.dtype) * self._shift)


class ProjectionInputHook(ModelHook):
    """Base of hooks that edit the input of the attention output projection of some layers (per-head edits).

    Subclasses set ``self.edit_layers`` and implement :meth:`_edit` (``x [B, T, H * d_head] -> x'``).
    """

    edit_layers: list[int]

    def _attach(self, stack: ExitStack) -> None:
        self._place()
        for layer in self.edit_layers:
            proj = self.layout.attn_out_projs[layer]
            stack.callback(proj.register_forward_pre_hook(partial(self._pre_hook, layer), with_kwargs=True).remove)

    def _pre_hook(self, layer: int, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (self._edit(layer, args[0]), *args[1:]), kwargs
        return args, {**kwargs, "input": self._edit(layer, kwargs["input"])}

    def _place(self) -> None:
        """Move the hook's tensors next to the layers they edit, once, when the hook attaches (subclasses)."""

    def _device_of(self, layer: int) -> torch.device | None:
        anchor = first_float_parameter(self.layout.layers[layer])
        return None if anchor is None else anchor.device

    @abstractmethod
    def _edit(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The edited projection input of ``layer``."""

    def _head_slice(self, head: int) -> slice:
        d = self.layout.head_dim
        return slice(head * d, (head + 1) * d)


class HeadScaler(ProjectionInputHook):
    """Multiply attention heads by scales: ``o^{l,h} <- s_{l,h} * o^{l,h}`` before the output projection.

    A pre-hook on layer ``l``'s attention output projection multiplies the slice
    ``[h * d_head, (h + 1) * d_head)`` of its input (head ``h``'s attention output; query heads under GQA) by
    the factor; every other channel is multiplied by exactly 1, so it is unchanged bit for bit.

    With ``gate`` the factor of head ``(l, h)`` is ``1 + (s_{l,h} - 1) * g`` where ``g = gate(l)``, read at every
    forward call: a float, a ``[B]`` tensor (per row) or a ``[B, T]`` tensor (per position of the call). ``g = 0``
    leaves the model exactly unchanged; ``g = 1`` applies the full scales (WET's entropy gate, :mod:`zoo.interp.wet`).

    Args:
        model: the causal LM.
        scales: ``{(layer, head): scale}``.
        gate: optional ``layer -> g`` callable for step-dependent scaling.
    """

    def __init__(self, model: nn.Module, scales: Mapping[Head, float], gate: Gate | None = None) -> None:
        super().__init__(model)
        if not scales:
            raise ConfigError("scales is empty: give at least one {(layer, head): scale}")
        width = self.layout.num_heads * self.layout.head_dim
        self.deltas: dict[int, torch.Tensor] = {}
        for key, scale in scales.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ConfigError(f"head scale key {key!r} must be a (layer, head) tuple")
            layer, head = self.layout.check_head(*key, what="head scale")
            if not math.isfinite(float(scale)):
                raise ConfigError(f"scale of head ({layer}, {head}) is {scale!r}; it must be finite")
            delta = self.deltas.setdefault(layer, torch.zeros(width))
            delta[self._head_slice(head)] = float(scale) - 1.0
        self.scales = {tuple(k): float(v) for k, v in scales.items()}
        self.gate = gate
        self.edit_layers = sorted(self.deltas)

    def _place(self) -> None:
        for layer, delta in self.deltas.items():
            device = self._device_of(layer)
            if device is not None:
                self.deltas[layer] = delta.to(device)

    def _edit(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        delta = self.deltas[layer]
        if delta.device != x.device:  # a layer that moved after the hook attached: follow it once
            delta = self.deltas[layer] = delta.to(x.device)
        if self.gate is None:
            factor = 1.0 + delta
        else:
            factor = 1.0 + delta * _gate_tensor(self.gate(layer), x, layer)
        return (x * factor).to(x.dtype)


def _gate_tensor(g: float | torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor | float:
    """Shape a gate value for broadcasting against the projection input ``x [B, T, F]``."""
    if not isinstance(g, torch.Tensor):
        return float(g)
    g = g.to(device=x.device, dtype=torch.float32)
    if g.dim() == 0:
        return g
    if g.dim() == 1 and g.shape[0] == x.shape[0]:
        return g[:, None, None]
    if g.dim() == 2 and tuple(g.shape) == tuple(x.shape[:2]):
        return g[..., None]
    raise ConfigError(
        f"gate({layer}) returned shape {list(g.shape)}; expected a float, "
        f"[B]={x.shape[0]} or [B, T]={list(x.shape[:2])}"
    )


class HeadPatcher(ProjectionInputHook):
    """Replace heads' attention outputs at one position with given values (activation patching).

    Meant for single forward passes: at every call the slice of head ``(l, h)`` at ``position`` of the output
    projection's input is overwritten with ``values[(l, h)]`` (``[B, d_head]``).

    Args:
        model: the causal LM.
        patches: ``{(layer, head): values [B, d_head]}``.
        position: the position patched (default the last one; with left padding, every row's last token).
    """

    def __init__(self, model: nn.Module, patches: Mapping[Head, torch.Tensor], position: int = -1) -> None:
        super().__init__(model)
        if not patches:
            raise ConfigError("patches is empty: give at least one {(layer, head): values}")
        self.patches: dict[int, list[tuple[int, torch.Tensor]]] = {}
        for key, values in patches.items():
            layer, head = self.layout.check_head(*key, what="patched head")
            if values.dim() != 2 or values.shape[1] != self.layout.head_dim:
                raise ConfigError(
                    f"patch values of head ({layer}, {head}) have shape {list(values.shape)}; expected "
                    f"[batch, {self.layout.head_dim}]"
                )
            self.patches.setdefault(layer, []).append((head, values.detach()))
        self.position = position
        self.edit_layers = sorted(self.patches)

    def _place(self) -> None:
        for layer, patches in self.patches.items():
            device = self._device_of(layer)
            if device is not None:
                self.patches[layer] = [(head, values.to(device)) for head, values in patches]

    def _edit(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        for head, values in self.patches[layer]:
            if values.shape[0] != x.shape[0]:
                raise ConfigError(
                    f"patch values of head ({layer}, {head}) have {values.shape[0]} rows; batch is {x.shape[0]}"
                )
            x[:, self.position, self._head_slice(head)] = values.to(dtype=x.dtype)
        return x


def forward_left_padded(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One uncached forward of a left-padded batch (positions from the mask); returns logits ``[B, T, V]``."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False).logits


@torch.no_grad()
def activations_at(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layers: Sequence[int],
    site: Site = "residual",
    position: int = -1,
    batch_size: int = 64,
) -> dict[int, torch.Tensor]:
    """Activations of a left-padded batch at one position, computed in chunks of ``batch_size`` rows.

    Args:
        model: the causal LM (put in eval mode for the call, then restored).
        input_ids, attention_mask: ``[N, P]`` left-padded, so ``position=-1`` is every row's last token.
        layers: decoder layers to read.
        site: ``"residual"`` (returns ``{layer: [N, d]}``) or ``"heads"`` (``{layer: [N, H, d_head]}``).
        position: the position read.
        batch_size: rows per forward.

    Returns:
        float32 tensors on CPU.
    """
    if input_ids.shape[0] == 0:
        raise ConfigError("no prompts: give at least one")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    cache = ActivationCache(model, layers, site=site)
    was_training = model.training
    model.eval()
    out: dict[int, list[torch.Tensor]] = {layer: [] for layer in cache.layers}
    try:
        for start in range(0, input_ids.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            with cache:
                forward_left_padded(model, input_ids[rows], attention_mask[rows])
            for layer in cache.layers:
                out[layer].append(cache[layer][:, position].float().cpu())
    finally:
        model.train(was_training)
    return {layer: torch.cat(chunks) for layer, chunks in out.items()}


def collect_activations(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    layers: Sequence[int],
    site: Site = "residual",
    position: int = -1,
    batch_size: int = 64,
) -> dict[int, torch.Tensor]:
    """:func:`activations_at` of text prompts, tokenized as the datamodules do
    (:func:`zoo.encoding.encode_prompts`) and left-padded per batch of ``batch_size``; default position: each
    prompt's last token."""
    if not prompts:
        raise ConfigError("prompts is empty: give at least one prompt")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    device = next(model.parameters()).device
    chunks = []
    for start in range(0, len(prompts), batch_size):
        ids, mask = encode_prompts(tokenizer, prompts[start : start + batch_size], device)
        chunks.append(activations_at(model, ids, mask, layers, site, position, batch_size))
    return {layer: torch.cat([c[layer] for c in chunks]) for layer in chunks[0]}
