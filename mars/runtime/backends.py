"""The decoder's view of a model: one forward function and one KV cache, whichever code runs the model.

    forward(ids, positions, allowed, keep) -> logits (b, len(keep), V), float32, on the CPU (static: on the
                                              model's device, where the modes score and accept them)
    length        columns held in the KV cache
    truncate(n)   keep columns [0, n): drops mask and rejected-draft KV after a pass
    select(rows)  keep these batch rows (finished rows leave the batch)
    add_rows(n)   n new empty rows at the end of the batch (rows join it: mars.decoding.scheduler)
    compact(order) order (b, n) long: row r keeps its cached columns order[r], in that order, as its first n
                  (each row's keys packed to the left: mars.decoding.cache.BlockCache.compact)
    gather(cols)  optional (hf, fast): keep these cached columns, in this order, as the first ones (the
                  acceptance lab lays each answer's KV side by side; fast: the same bits, see KVCache.gather)

`forward` feeds a window of W columns per row after the cached ones; `allowed` (b, W, length + W) says
which keys each window input may attend to. A backend with `skips_padding` also takes `padding=` (b, W) bool:
inputs nobody reads (a batch's padding), which it may leave uncomputed (their logits: zeros). Backends:
  hf        transformers' own forward and DynamicCache: the reference path
  fast      mars.runtime.fastpath: the same math in fewer ops, a preallocated cache (Llama / Qwen2 only)
  fast-bf16 fast, with bfloat16 matrices: faster, NOT exact (numerics change); opt-in only
  fast-int8 fast, with int8 matrices (mars.runtime.quant): a quarter of the bytes; its own model, whose greedy
            text the lossless modes then reproduce exactly (batch = alone, verified = its AR)
  static    mars.runtime.static: the fast path at fixed padded shapes, replayed as CUDA graphs on a GPU
  static-device  the static pass inside a whole decoding step on the device (mars.decoding.device_step,
            mars.runtime.step_runner): the decoder reads the device once per k steps; a plain runner of this
            name (a caller that wants passes, not steps) is `static`
  auto      where the model is supported: fast on the CPU, static on a GPU; else hf
  auto-int8 as auto, but fast-int8 on the CPU (the app's default: MARS_BACKEND)
"""

from __future__ import annotations

import torch

from mars.runtime.attention import additive_mask
from mars.runtime.names import BACKENDS
from mars.runtime.scoring import C_SCORING

WEIGHT_DTYPES = {"fast-bf16": torch.bfloat16, "fast-int8": torch.int8}  # fast backends with other matrices


class HFBackend:
    scoring = None  # the reference: torch ops only (the decoder's acceptance functions), no C

    def __init__(self, model, use_cache: bool = True):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config) if use_cache else None  # None: nothing is ever kept
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device

    @property
    def length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def forward(self, ids, positions, allowed, keep: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(
                input_ids=ids.to(self.device),
                position_ids=positions.to(self.device),
                attention_mask=additive_mask(allowed[:, None], self.dtype).to(self.device),
                past_key_values=self.cache,
                use_cache=self.cache is not None,
                logits_to_keep=torch.tensor(keep, device=self.device),
            )
        return out.logits.float().cpu()

    def truncate(self, n: int):
        if self.cache is not None and self.length > n:
            self.cache.crop(n - self.length)

    def select(self, rows: list[int]):
        if self.cache is not None:
            self.cache.batch_select_indices(torch.tensor(rows, device=self.device))

    def _layers(self):
        return [layer for layer in getattr(self.cache, "layers", []) if getattr(layer, "keys", None) is not None
                and layer.keys.numel()]

    def add_rows(self, n: int):
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                setattr(layer, name, torch.cat([t, t.new_zeros((n,) + t.shape[1:])]))

    def compact(self, order: torch.Tensor):
        for layer in self._layers():
            idx = order.to(self.device)[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)

    def gather(self, cols: list[int]):
        """Keep cached columns `cols`, in this order (FastBackend.gather)."""
        if self.cache is None:
            return
        if any(not 0 <= c < self.length for c in cols):
            raise ValueError(f"columns must be in [0, {self.length})")
        idx = torch.tensor(cols, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)


class FastBackend:
    scoring = C_SCORING  # greedy p(token) and top-k of its CPU float32 logits in one C call each
    skips_padding = True  # forward(..., padding=): inputs nobody reads are not computed (the int8 C layers)

    def __init__(self, flm, batch: int, capacity: int):
        """flm: the model's fast path (mars.runtime.fastpath.fast_model, built once per model and weight dtype)."""
        self.lm = flm
        self.cache = self.lm.new_cache(batch, capacity)

    @property
    def length(self) -> int:
        return self.cache.length

    def forward(self, ids, positions, allowed, keep: list[int], padding=None) -> torch.Tensor:
        d = self.lm.device
        logits = self.lm.forward(ids.to(d), positions.to(d), allowed.to(d), torch.tensor(keep, device=d), self.cache,
                                 padding)
        return logits.float().cpu()

    def truncate(self, n: int):
        self.cache.truncate(n)

    def select(self, rows: list[int]):
        self.cache.select(rows)

    def add_rows(self, n: int):
        self.cache.add_rows(n)

    def compact(self, order: torch.Tensor):
        self.cache.compact(order)

    def gather(self, cols: list[int]):
        """Keep cached columns `cols`, in this order, as the first ones (mars.runtime.fastpath.KVCache.gather)."""
        self.cache.gather(cols)


def resolve_backend(model, name: str) -> str:
    """'auto' -> 'fast' or 'hf', 'auto-int8' -> 'fast-int8' or 'hf'; 'fast' on a model the fast path cannot run
    is an error that says why."""
    from mars.runtime.fastpath import unsupported_reason

    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "hf":
        return name
    reason = unsupported_reason(model)
    if name in ("auto", "auto-int8"):
        if reason is not None:
            return "hf"
        # padding a pass to a fixed width costs real arithmetic on a CPU, and nothing on a GPU (host-bound)
        if next(model.parameters()).device.type != "cpu":
            return "static"
        return "fast" if name == "auto" else "fast-int8"
    if reason is not None:
        raise ValueError(f"backend {name!r} cannot run this model: {reason}; use backend 'hf'")
    return name  # a CPU that cannot run fast-bf16 is refused by FastLM itself, the one place that checks


def make_backend(model, name: str, batch: int, capacity: int, use_cache: bool = True):
    """A backend for one decoding run of `batch` rows, sized for `capacity` columns (it grows if needed)."""
    name = resolve_backend(model, name)
    if name == "hf":
        return HFBackend(model, use_cache)
    if name in ("static", "static-device"):
        from mars.runtime.static import StaticBackend

        return StaticBackend(model, batch, capacity)
    from mars.runtime.fastpath import fast_model

    return FastBackend(fast_model(model, WEIGHT_DTYPES.get(name)), batch, capacity)


def make_step_runner(model, cfg, batch: int, capacity: int, scratch: int):
    """The device step's runner (mars.runtime.step_runner) for one run of `batch` rows: `capacity` real columns
    and `scratch` more for what a step never keeps."""
    resolve_backend(model, "static-device")  # a model the fast path cannot run is refused, saying why
    from mars.runtime.step_runner import make_step_runner as make

    return make(model, cfg, batch, capacity, scratch)
