"""Quality measures for a generation, relative to the plain AR model: small pure functions.

- `mean_nll`: how likely the AR model finds a text (one teacher-forced causal forward of prompt + text).
- `prefix_agreement`, `prefix_match`: how much of the AR output a run reproduced exactly, from the start.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mean_nll(lm, prompt_ids: list[int], token_ids: list[int]) -> float:
    """Mean negative log-likelihood (nats per token) of `token_ids` after `prompt_ids` under the causal model.

    One forward over [prompt | tokens] with the model's default causal attention; the logits at position t
    are scored against token t+1 (the usual shift), so only the generated tokens are scored.
    """
    if not prompt_ids or not token_ids:
        raise ValueError("mean_nll needs at least one prompt token and one generated token")
    model = lm.model
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], dtype=torch.long, device=device)  # (1, P + T)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]  # (P + T, V)
    if logits.dtype != torch.float64:
        logits = logits.float()  # bf16 / fp16 models: score in float32
    P = len(prompt_ids)
    scoring = logits[P - 1:-1]  # (T, V): the position before each generated token
    targets = torch.tensor(list(token_ids), dtype=torch.long, device=scoring.device)
    return float(F.cross_entropy(scoring, targets, reduction="mean"))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Number of leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def prefix_agreement(reference: list[int], candidate: list[int]) -> float:
    """Length of the common prefix over the longer of the two: 1.0 only for identical sequences."""
    longest = max(len(reference), len(candidate))
    return common_prefix(reference, candidate) / longest if longest else 1.0


def prefix_match(reference: list[int], candidate: list[int]) -> float:
    """Fraction of the reference reproduced before the first difference (the bench's prefix_match_with_ar)."""
    return common_prefix(reference, candidate) / len(reference) if reference else 1.0
