"""What the int8 fast path's error-feedback rounding (mars.runtime.rounding) needs to know about a model's
inputs: H = E[x^T x] over calibration tokens, at the input of each matrix the fast path fuses.

Why text the model writes itself: the runtime gets a model, not a tokenizer, and any text in the model's
own distribution serves (GPTQ's calibration needs typical activations, not a task). ROWS sequences are
sampled from the float model from its BOS token (temperature 1, a fixed seed, so the same model gives the
same tokens), and the matrices' inputs of every position are summed in float32 by forward hooks on the
model's own modules (transformers' forward: the float model is the reference being approximated).
"""

from __future__ import annotations

import torch

ROWS = 16  # sequences sampled at once
STEPS = 32  # tokens sampled per sequence: ROWS * (STEPS + 1) = 528 calibration positions
SEED = 0


def sample_tokens(model, rows: int = ROWS, steps: int = STEPS, seed: int = SEED) -> torch.Tensor:
    """(rows, steps + 1) token ids: BOS, then `steps` tokens sampled from the model at temperature 1."""
    cfg = model.config
    start = cfg.bos_token_id if cfg.bos_token_id is not None else (cfg.eos_token_id or 0)
    if isinstance(start, (list, tuple)):
        start = start[0]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((rows, 1), int(start), dtype=torch.long)
    with torch.inference_mode():
        cache = None
        step_ids = ids
        for _ in range(steps):
            out = model(input_ids=step_ids, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            step_ids = torch.multinomial(probs, 1, generator=gen)
            ids = torch.cat([ids, step_ids], dim=1)
    return ids


def input_moments(model, groups: dict, ids: torch.Tensor | None = None) -> dict:
    """{group name: H (in, in) float32 = mean over calibration positions of x^T x at that matrix's input}, for
    groups {name: [modules side by side, reading the same input]} (mars.runtime.int8_weights.groups).
    ids: the calibration tokens (rows, length); by default `sample_tokens(model)`."""
    if ids is None:
        ids = sample_tokens(model)
    mods = {name: group[0] for name, group in groups.items()}
    sums: dict = {}
    count: dict = {}

    def hook(name):
        def add(_mod, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            sums[name] = x.T @ x if name not in sums else sums[name].addmm_(x.T, x)
            count[name] = count.get(name, 0) + x.shape[0]
        return add

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in mods.items()]
    try:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return {name: sums[name] / count[name] for name in sums}
