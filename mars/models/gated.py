"""A gated adapter: LoRA deltas that act only at rows whose input is the mask token.

Why (issue 13, item 5): with the adapter switched off at every real token, real tokens' hidden states and
KV are the bare model's. The AR prediction (the output at the last real token) is then the bare model's,
so tau = 1.0 and the verified mode reproduce the bare model's greedy output exactly, and training needs
no gradient through the clean copy at all (it is the bare model: one no-grad forward gives the noisy
copy its keys and values). No parameter is added. This departs from the paper's recipe, which fine-tunes
every position and keeps the AR head close to the base only through the clean copy's SFT loss.

The gate is one rule everywhere: gate = (input id == mask token id), row by row.
  training      peft's LoRA layers, with each lora_B output multiplied by the gate (`gate_peft_model`)
  inference     the bare model plus the deltas read from the adapter folder (`GatedLoRA`): transformers'
                forward through forward hooks, the fast path (mars.runtime.fastpath) in its own Linear
An adapter is gated when its mars.json says `"gated": true`; `mars.models.loading.load` then attaches it
instead of merging it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

GATED_KEY = "gated"  # mars.json flag
_PREFIX = "base_model.model."  # peft's prefix of the wrapped model's module names


class MaskRows:
    """The rows of the forward in flight whose input is the mask token: set by a pre-hook on the input
    embedding, cleared after the model's forward (a forward fed embeddings, with no ids, must not reuse an
    old gate). One per model; the model runs one forward at a time."""

    def __init__(self, mask_token_id: int):
        self.mask_token_id = int(mask_token_id)
        self.rows: torch.Tensor | None = None  # (b, W) bool

    def watch(self, model) -> list:
        def set_rows(module, args):
            self.rows = args[0] == self.mask_token_id

        def clear(module, args, out):
            self.rows = None

        return [model.get_input_embeddings().register_forward_pre_hook(set_rows),
                model.register_forward_hook(clear)]


class GatedLoRA:
    """LoRA deltas per Linear module, added only at gated rows: y[g] += (x[g] @ A.T) @ B.T (B scaled).

    The transformers path keeps the gate of the forward in flight on this object, so a model runs one
    forward at a time (as everywhere in this project: the app's passes take turns under one lock)."""

    def __init__(self, mask_token_id: int, deltas: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        self.mask_token_id = int(mask_token_id)
        self.deltas = deltas  # module name -> (A (r, in), B * scaling (out, r))
        self.mask_rows = MaskRows(mask_token_id)  # the transformers path's gate
        self._handles: list = []

    @classmethod
    def read(cls, folder: str | Path, model, mask_token_id: int) -> "GatedLoRA":
        """The deltas of a peft LoRA folder (adapter_config.json + adapter_model.safetensors) for `model`.
        Raises ValueError naming what does not fit."""
        from safetensors.torch import load_file

        folder = Path(folder)
        conf = json.loads((folder / "adapter_config.json").read_text())
        if conf.get("peft_type", "LORA") != "LORA" or conf.get("use_dora"):
            raise ValueError("a gated adapter must be a plain LoRA adapter")
        r, alpha = int(conf["r"]), float(conf["lora_alpha"])
        scaling = alpha / (r ** 0.5) if conf.get("use_rslora") else alpha / r
        weights = load_file(str(folder / "adapter_model.safetensors"))
        modules = dict(model.named_modules())
        deltas = {}
        for key, a in weights.items():
            if not key.endswith(".lora_A.weight"):
                continue
            name = key[: -len(".lora_A.weight")].removeprefix(_PREFIX)
            b = weights.get(key.replace(".lora_A.", ".lora_B."))
            mod = modules.get(name)
            if b is None or not isinstance(mod, torch.nn.Linear):
                raise ValueError(f"adapter weight {key!r} has no Linear module {name!r} (or no lora_B) in this model")
            if a.shape[1] != mod.in_features or b.shape[0] != mod.out_features or a.shape[0] != b.shape[1]:
                raise ValueError(f"adapter weights of {name!r} do not fit the module's shape")
            p = mod.weight
            deltas[name] = (a.to(p.device, p.dtype), (b * scaling).to(p.device, p.dtype))
        if not deltas:
            raise ValueError("no LoRA weights found")
        return cls(mask_token_id, deltas)

    def attach(self, model) -> "GatedLoRA":
        """Hook the gate into `model` (transformers' forward) and mark it for the fast path."""
        self.detach()
        self._handles += self.mask_rows.watch(model)
        modules = dict(model.named_modules())
        for name in self.deltas:
            self._handles.append(modules[name].register_forward_hook(self._hook(name)))
        model._mars_gated = self
        return self

    def detach(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, name: str):
        def hook(module, args, out):
            return self.apply(name, args[0], out, self.mask_rows.rows)
        return hook

    def apply(self, name: str, x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """y plus the delta of module `name` at the gated rows (y unchanged where no row is gated)."""
        if gate is None or gate.shape != x.shape[:-1] or not bool(gate.any()):
            return y
        a, b = self.deltas[name]
        d = (x[gate].to(a.dtype) @ a.T) @ b.T
        y = y.clone()
        y[gate] += d.to(y.dtype)
        return y

    def fused(self, modules: dict[str, torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One (A, B) for Linear modules run side by side with fused outputs (the fast path's q|k|v and
        gate|up): A stacked, B block-diagonal (a module without a delta gets an empty block). None when
        none of them is adapted."""
        if not any(n in self.deltas for n in modules):
            return None
        ref = next(self.deltas[n][0] for n in modules if n in self.deltas)  # dtype and device of the deltas
        parts = []
        for n, mod in modules.items():
            empty = (ref.new_zeros(0, mod.in_features), ref.new_zeros(mod.out_features, 0))
            parts.append(self.deltas.get(n) or empty)
        return torch.cat([a for a, _ in parts]), torch.block_diag(*[b for _, b in parts])


def gate_peft_model(model, mask_token_id: int) -> list:
    """Training: multiply every LoRA layer's lora_B output by the gate, so the adapter acts only at mask
    rows. Returns the hook handles."""
    gate = MaskRows(mask_token_id)

    def hook(module, args, out):
        g = gate.rows
        if g is None or g.shape != out.shape[:-1]:
            raise RuntimeError("gated LoRA: the gate does not match this forward's rows")
        return out * g.unsqueeze(-1).to(out.dtype)

    handles = gate.watch(model)
    n_hooks = len(handles)
    for name, mod in model.named_modules():
        if name.split(".")[-2:-1] == ["lora_B"]:  # lora_B.<adapter name>
            handles.append(mod.register_forward_hook(hook))
    if len(handles) == n_hooks:
        raise ValueError("gate_peft_model: no LoRA layers found")
    return handles


@contextlib.contextmanager
def adapter_off(model):
    """Run `model` as the bare model for the duration: its gated adapter (if any) finds no mask row to act at.

    The gate is the one rule above, (input id == mask token id), read per forward by both paths (the hooks'
    MaskRows and the fast path's FastLM.forward); an id no input can have closes it, and the weights, the fast
    path's matrices and the deltas all stay as they are. Mask inputs then run the bare model: what the
    acceptance lab compares the adapter with. One forward at a time (the app's model thread): a pass of
    another visitor must not run inside this block.
    """
    gated = getattr(model, "_mars_gated", None)
    if gated is None:
        yield model
        return
    ids = gated.mask_token_id, gated.mask_rows.mask_token_id
    gated.mask_token_id = gated.mask_rows.mask_token_id = -1
    try:
        yield model
    finally:
        gated.mask_token_id, gated.mask_rows.mask_token_id = ids
