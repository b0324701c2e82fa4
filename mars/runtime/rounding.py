"""Rounding a matrix to the int8 grid with error feedback (GPTQ, arXiv 2210.17323), for the int8 fast path.

Why: at 7 bits per weight (|W_q| <= 64, mars.runtime.quant) rounding each weight to its nearest grid point
cost the default model most of its int8 quality loss: weights alone (float rows) took known answers from
28/80 to 24/80, 8-bit rows alone (float weights) none (29/80); docs/int8.md. What a matrix's rounding costs
is its output error on real inputs, E ||x (W - W_q s)^T||^2 = sum_o d_o H d_o^T for H = E[x^T x]: a weight's
error can be cancelled by nudging the weights of the inputs not yet rounded that are correlated with it.
GPTQ does that column by column, on the same grid and scales as plain rounding (the kernels' format is
unchanged): each column is rounded, and its error, divided by the pivot of H^-1's Cholesky factor, is
subtracted from the later columns along that factor's row. On the default model this cut the output error
on calibration text 4-8x (per matrix) and KL to float32 ~35%.

`round_columns` is the obvious column-by-column form (the tests' yardstick); `gptq_round` the same in
blocks of columns, the later columns updated once a block (the same sums, regrouped).
"""

from __future__ import annotations

import torch

BLOCK = 128  # columns rounded between updates of the rest: larger blocks, fewer and larger products
DAMP = 0.01  # added to H's diagonal, times its mean: H from a few hundred tokens is near singular


def _factor(h: torch.Tensor) -> torch.Tensor:
    """U (in, in) float64, upper: the Cholesky factor of H^-1 (after damping), U^T U = H^-1. An input that is
    always 0 gets H's mean on its diagonal (its weights are then rounded plainly, nothing to feed back)."""
    h = h.double().clone()
    n = h.shape[0]
    dead = torch.diagonal(h) <= 0
    diag = torch.diagonal(h)
    mean = diag[~dead].mean() if (~dead).any() else h.new_tensor(1.0)
    diag[dead] = mean
    diag += DAMP * mean
    inv = torch.cholesky_inverse(torch.linalg.cholesky(h))
    return torch.linalg.cholesky(inv, upper=True) if n else inv


def _round(w: torch.Tensor, scale: torch.Tensor, wmax: int) -> torch.Tensor:
    return torch.round(w / scale).clamp_(-wmax, wmax)


def round_columns(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, wmax: int) -> torch.Tensor:
    """W_q (out, in) int8: w (out, in) rounded on the grid scale (out,) * [-wmax, wmax], column by column,
    each column's error fed forward into the columns after it (float64)."""
    u = _factor(h)
    w = w.double().clone()
    s = scale.double()
    q = torch.empty_like(w)
    for i in range(w.shape[1]):
        q[:, i] = _round(w[:, i], s, wmax)
        err = (w[:, i] - q[:, i] * s) / u[i, i]
        w[:, i + 1:] -= err[:, None] * u[i, i + 1:][None, :]
    return q.to(torch.int8)


def gptq_round(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, wmax: int, block: int = BLOCK) -> torch.Tensor:
    """`round_columns`, with the columns after a block updated once per block (float64)."""
    u = _factor(h)
    w = w.double().clone()
    s = scale.double()[:, None]
    n = w.shape[1]
    q = torch.empty_like(w)
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        wb = w[:, i0:i1]  # a view: updated in place as the block's columns are rounded
        errs = torch.empty_like(wb)
        for j in range(i1 - i0):
            i = i0 + j
            q[:, i] = _round(wb[:, j], s[:, 0], wmax)
            errs[:, j] = (wb[:, j] - q[:, i] * s[:, 0]) / u[i, i]
            wb[:, j + 1:] -= errs[:, j, None] * u[i, i + 1:i1][None, :]
        w[:, i1:] -= errs @ u[i0:i1, i1:]
    return q.to(torch.int8)
