"""A model's int8 weights for the fast path, rounded with error feedback (mars.runtime.rounding) on its own
calibration text (mars.runtime.calibration), and kept on disk under MARS_CACHE.

Why the disk: calibrating (a few hundred sampled tokens) and rounding every matrix column by column costs
tens of seconds on two cores (the LM head's 49,152 rows most), once per model; plain rounding cost ~3 s.
The file is keyed by a hash of every matrix's float weights and of the rounding's settings, so a changed
model or rule never reads an old file.
"""

from __future__ import annotations

import hashlib
import os

import torch

from mars import settings
from mars.runtime import calibration, rounding
from mars.runtime.linear import fuse, layer_groups

VERSION = 1  # bump when the rule changes in a way the settings hashed below do not show


def groups(model) -> dict:
    """{name: [modules]}: the matrices the fast path fuses (q|k|v, o, gate|up, down per layer; the LM head),
    each group's modules reading the same input."""
    out = {f"{i}.{group}": mods for i, layer in enumerate(model.model.layers)
           for group, mods in layer_groups(layer).items()}
    out["head"] = [model.lm_head]
    return out


def _key(model) -> str:
    from mars.runtime.quant import WEIGHT_MAX

    h = hashlib.blake2b(digest_size=16)
    h.update(repr((VERSION, WEIGHT_MAX, rounding.BLOCK, rounding.DAMP, calibration.ROWS, calibration.STEPS,
                   calibration.SEED)).encode())
    for name, mods in groups(model).items():
        for mod in mods:
            w = mod.weight.detach().float().contiguous()
            h.update(name.encode() + repr(tuple(w.shape)).encode())
            h.update(w.numpy().tobytes())
    return h.hexdigest()


def round_model(model) -> dict:
    """{group name: W_q (out, in) int8}: every fused matrix rounded with error feedback on the moments of its
    input over the model's calibration text, on quantize_weight's grid."""
    from mars.runtime.quant import WEIGHT_MAX, weight_scale

    fused = groups(model)
    moments = calibration.input_moments(model, fused)
    out = {}
    for name, mods in fused.items():
        w = fuse(mods)[0].float()
        out[name] = rounding.gptq_round(w, moments[name], weight_scale(w), WEIGHT_MAX)
    return out


def rounded_weights(model) -> dict:
    """`round_model(model)`, read from MARS_CACHE/int8 when this model was rounded before, else computed and
    written there (a file that cannot be written only costs the next load the time again)."""
    folder = settings.get().cache / "int8"
    path = folder / f"{_key(model)}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except (OSError, RuntimeError, EOFError):
            pass  # a torn or foreign file: compute again
    out = round_model(model)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(out, tmp)
        os.replace(tmp, path)
    except OSError:
        pass
    return out
