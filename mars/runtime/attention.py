"""The attention mask as the runtime feeds it: the decoder and the trainer say who may see whom with a boolean
mask (mars.decoding.masks); attention adds a float one."""

from __future__ import annotations

import torch

def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (..., q, k) -> float mask on the same device: 0 where allowed, the dtype's minimum elsewhere.

    An additive float mask means the same thing to transformers' eager and SDPA attention alike, and the
    fast path builds it once per pass instead of once per layer.
    """
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)
