"""int8 matrices for the fast path (`backend="fast-int8"`): a quarter of float32's bytes per pass.

Why: at batch 1 on a CPU a small model's pass is the time to stream its weights. Measured here (the default
model's 121 matrices, 2 threads): float32 `F.linear` 23 ms for 1 row and ~48 ms for 5; `torch._int_mm`
(int8 x int8 -> int32, oneDNN) 12 ms for 1 row and ~14 ms for 5. torch's weight-only int8 kernel was 4x
slower than float32, and fbgemm's dynamic quantization uses one activation scale per pass, which couples
the rows (a row's output would depend on the other rows of its pass: batch != alone, verified != AR).

The rule, per Linear (q|k|v and gate|up fused, as in the packed float layout):
    W_q = round(W / s_w) in [-WEIGHT_MAX, WEIGHT_MAX]   s_w = max|W[o, :]| / WEIGHT_MAX   (per output channel)
    u   = x / s_x,  x_q = round(u) in [-127, 127]       s_x = max|x[r, :]| / 127          (per row, each pass)
    r_q = round((u - x_q) * 254) in [-127, 127]         the rounding's residual: ~16-bit rows
    y   = ([x_q | r_q] @ W_q.T  combined as  acc_x + acc_r / 254) * s_x[r] * s_w[o]  (+ bias)
x_q and r_q go through one product as 2n rows: the weights are streamed once, so the residual costs little.
Every row is quantized on its own and the integer products are exact, so a row's output is the same whatever
else is in its pass: batch = alone and verified = this model's AR greedy hold token for token.

Which kernels (measured here, 2 threads, the default model's 121 matrices, 2 rows = one token):
  - a pass of up to 16 tokens runs mars.runtime.kernels' C product (VNNI or AVX2 instructions on weights
    blocked by output channel, the rescale fused in): 7.9 ms for one token, 10.9 ms for five, 18.7 for 16;
  - more (a prompt) run oneDNN's int8 linear on weights packed once (AMX here): 12.5 ms for one token, 19.5
    for 16, but 49.5 ms for one where oneDNN is capped at AVX2 (an AMD EPYC without VNNI);
  - `torch._int_mm` on a plain layout (this module's kernel before): 12.8 ms, 20.7 ms at AVX2;
  - float32 `F.linear`: 22 ms.
The rows are quantized and the sums rescaled by C loops too (RMSNorm, SiLU * up and the residual add fused
in); with no C compiler the same steps run as tensor ops (~2x the overhead).

Why 7 bits of weight (WEIGHT_MAX = 64) and not 8: on CPUs without VNNI (AVX2-only, AVX-512 before Cascade
Lake) oneDNN multiplies u8 x s8 pairs with vpmaddubsw, whose 16-bit sums saturate: with full-range weights
`_int_mm` returned wrong integers there (checked with ONEDNN_MAX_CPU_ISA=AVX2); the C product's AVX2 path uses
the same instruction. With |W_q| <= 64 a pair's sum
is at most 2 * 255 * 64 = 32640 < 2^15, so every CPU computes the same exact integers, and the int8 model's
text is the same on the Space's AVX2 machine as here.

The gated adapter's deltas (mars.models.gated) stay in float, added after the int8 product.
"""

from __future__ import annotations

import torch

from mars.runtime.kernels import (MAX_C_ROWS, LoraWeights, block_weights, combine_rows2, gemv_rows2, kernels,
                                   lora_rows, padded, quant_rows2, rmsnorm_quant, silu_mul_quant)
from mars.runtime.linear import Gate, Linear, fuse

WEIGHT_MAX = 64  # |W_q| bound: exact integer products on every x86 ISA (see the module docstring)
ACT_MAX = 127


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_q int8 (out, in), s_w float (out,)): symmetric, one scale per output channel (row of W)."""
    scale = w.abs().amax(dim=1).clamp_min(torch.finfo(w.dtype).tiny) / WEIGHT_MAX  # (out,)
    q = torch.round(w / scale[:, None]).clamp_(-WEIGHT_MAX, WEIGHT_MAX).to(torch.int8)
    return q, scale


# One int8 row per activation row was the larger error: measured on the default model (KL to float32's
# next-token distribution, teacher-forced on its greedy text, 12 held-out prompts): 8-bit rows 0.035, 7-bit
# weights 0.016, both 0.056. SmoothQuant's per-channel migration (arXiv 2211.10438) only reached 0.050 (alpha
# 0.5; higher alphas were worse, the 7-bit weights taking the range). Two int8 rows per row (the value and
# the residual of its rounding) cost ~nothing, since the pass is weight-bound, and bring the total to 0.0155:
# the weights' own error.
RESIDUAL_STEPS = 254  # the residual of rounding is in [-1/2, 1/2] step: 254 levels fill [-127, 127]


def quantize_rows2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows at ~16 bits as two int8 rows each: x ~ s_x * (x_q + r_q / RESIDUAL_STEPS), stacked [x_q | r_q]
    (2n, in), so that one product streams the weights once for both (2 rows cost ~1 row: the pass is
    weight-bound). Returns (stacked int8, s_x (n,))."""
    amax = torch.linalg.vector_norm(x, float("inf"), dim=1).clamp_min_(torch.finfo(x.dtype).tiny)
    u = (x * (ACT_MAX / amax)[:, None]).nan_to_num_(0.0)  # in [-127, 127]; a zero row: 0 * inf -> 0
    q = u.round()
    r = (u - q).mul_(RESIDUAL_STEPS).round_()  # |u - q| <= 1/2: r in [-127, 127]
    return torch.cat([q, r]).to(torch.int8), amax / ACT_MAX


_ONEDNN: dict = {}


def onednn_int8() -> bool:
    """Whether PyTorch's oneDNN int8 linear (`torch.ops.onednn.qlinear_pointwise`, weights packed once) runs
    here, checked once on a tiny product; else `torch._int_mm` runs the products."""
    if "ok" not in _ONEDNN:
        try:
            w = torch.ones(8, 16, dtype=torch.int8)
            y = torch.ops.onednn.qlinear_pointwise(
                torch.full((2, 16), 129, dtype=torch.uint8), 1.0, 128, torch.ops.onednn.qlinear_prepack(w, [1, 16]),
                torch.ones(8), torch.zeros(8, dtype=torch.long), None, 1.0, 0, torch.float32, "none", [], "")
            _ONEDNN["ok"] = bool((y == 16).all())
        except (AttributeError, RuntimeError):
            _ONEDNN["ok"] = False
    return _ONEDNN["ok"]


class Int8Linear(Linear):
    """The fast path's `Linear` (fused outputs, float gated deltas) with int8 weights.

    Activation rows run at ~16 bits as two int8 rows each (`quantize_rows2`), in the same product. Per call:
    quantize the rows, one integer product, rescale. Passes of up to MAX_C_ROWS tokens run the C product
    (mars.runtime.kernels, on its blocked copy of the weights); longer ones, and every pass where the C
    kernels cannot be built or the rows are not float32, run oneDNN's int8 linear on weights packed once
    (`torch._int_mm` where oneDNN's is missing), scaled by 1 so that it returns the exact integer sums as
    float32 (|sum| <= 1536 * 127 * 64 < 2^24 for this model's widths). Both copies of the weights are kept:
    the int8 weights' bytes twice, still half of float32's."""

    def __init__(self, mods: list, lora: tuple | None = None):
        if mods[0].weight.device.type != "cpu":  # CUDA's _int_mm wants > 16 rows: no use for decoding
            raise ValueError("backend 'fast-int8' runs on a CPU only; use 'auto' (or 'fast') on this device")
        w, self.bias = fuse(mods)  # (out, in): q|k|v or gate|up side by side, and their bias (or None)
        w = w.float()
        dtype = mods[0].weight.dtype
        self.lora = lora  # float deltas, added by Linear.__call__
        self.out_features = w.shape[0]
        self.dtype = torch.int8
        qweight, scale = quantize_weight(w)
        self.scale = scale.to(dtype)
        self.scale32 = scale  # float32, for the C rescale
        self.packed = self.qweight_t = None
        if onednn_int8():
            self.packed = torch.ops.onednn.qlinear_prepack(qweight, [1, w.shape[1]])
            self._ones = torch.ones(self.out_features)
            self._zeros = torch.zeros(self.out_features, dtype=torch.long)
        else:
            # _int_mm wants (in, out): the transposed view of the row-major (out, in) copy was the fastest
            # layout measured (12 ms a 1-row pass against 17 ms for a contiguous (in, out) copy)
            self.qweight_t = qweight.t()
        self.bias32 = None if self.bias is None else self.bias.float().contiguous()
        self._lib = kernels() if dtype == torch.float32 else None  # the C loops run float32 rows only
        self.in_features = w.shape[1]
        self.kp = padded(self.in_features) if self._lib is not None else self.in_features
        if self._lib is not None:  # the C product's copy: blocked by output channels, zero-padded, and row sums
            self.wblocked, self.wsum = block_weights(self._lib, qweight)
        # the gated deltas for the C kernels (at the gated rows only, float16 weights widened exactly), or None:
        # then the float tensor ops of Linear._delta add them
        self.lora_c = None
        if self._lib is not None and lora is not None:
            self.lora_c = LoraWeights.of(*lora, [m.weight.shape[0] for m in mods])

    def _sums(self, xq: torch.Tensor) -> torch.Tensor:
        """(2n, in) uint8 rows (value + 128) -> (2n, out) float32 exact integer sums against the weights."""
        if self.packed is not None:
            return torch.ops.onednn.qlinear_pointwise(xq, 1.0, 128, self.packed, self._ones, self._zeros, None,
                                                      1.0, 0, torch.float32, "none", [], "")
        return torch._int_mm((xq ^ 128).view(torch.int8), self.qweight_t).float()

    def _c(self, x: torch.Tensor) -> bool:
        return self._lib is not None and x.dtype == torch.float32

    @staticmethod
    def _rows(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, x.shape[-1])
        return x if x.stride(-1) == 1 else x.contiguous()

    def _rescale(self, xq, sx, lead, res=None, delta=None) -> torch.Tensor:
        """The product of rows xq (2n, kp) and its rescale: by the C product for a few rows (decoding), by
        oneDNN's for more (a prompt): the same exact integers, the same rescale. delta: None, or (the input
        rows, gated row indices): the gated delta added at those rows, in the C product's call where it runs."""
        res = None if res is None else self._rows(res)
        if delta is not None:
            delta = (*delta, self.lora_c)
        if sx.shape[0] <= MAX_C_ROWS:
            y = gemv_rows2(self._lib, xq, self.wblocked, self.wsum, sx, self.scale32, self.bias32, res, delta)
        else:
            xk = xq if self.kp == self.in_features else xq[:, : self.in_features].contiguous()
            y = combine_rows2(self._lib, self._sums(xk), sx, self.scale32, self.bias32, res)
            if delta is not None:
                lora_rows(self._lib, *delta, y)
        return y.view(*lead, self.out_features)

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if self._c(x):
            xq, sx = quant_rows2(self._lib, self._rows(x), self.kp)  # (2n, in) uint8: [x_q | residual_q] + 128, (n,)
            return self._rescale(xq, sx, lead)
        x = x.reshape(-1, x.shape[-1])
        n = x.shape[0]
        xq, sx = quantize_rows2(x)
        acc = self._sums(xq.view(torch.uint8) ^ 128).to(x.dtype)  # exact integers, one pass over W
        y = acc[:n].add_(acc[n:], alpha=1 / RESIDUAL_STEPS)
        y.mul_(sx[:, None]).mul_(self.scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*lead, self.out_features)

    # The layer's steps fused into the C loops (float32 rows); where they cannot run, Linear's plain ops.
    # The gated delta: by the C kernels at the gated rows only, after the product and its residual (in the
    # product's call up to MAX_C_ROWS tokens, `lora_rows` after oneDNN's product beyond), or by Linear's
    # tensor ops, the residual then added after it. Either way a real row's floats are the same (no delta, or
    # + 0 exactly); a mask row's differ by rounding (the order of the sums).
    def _c_delta(self, gate) -> bool:
        """Whether the C kernels add this pass's delta (else the tensor ops, or there is none)."""
        return self.lora_c is not None and isinstance(gate, Gate) and gate.rows.numel() <= MAX_C_ROWS

    def normed(self, x, weight, eps, gate=None):
        if not self._c(x):
            return super().normed(x, weight, eps, gate)
        lead = x.shape[:-1]
        h, xq, sx = rmsnorm_quant(self._lib, self._rows(x), weight, eps, self.kp)
        if self._c_delta(gate):
            return self._rescale(xq, sx, lead, delta=(h, gate.rows))
        return self._delta(self._rescale(xq, sx, lead), h.view(*lead, -1), gate)

    def add_to(self, res, x, gate=None):
        if not self._c(x):
            return super().add_to(res, x, gate)
        rows = self._rows(x)
        gated = self.lora is not None and gate is not None
        if gated and not self._c_delta(gate):
            return super().add_to(res, x, gate)
        xq, sx = quant_rows2(self._lib, rows, self.kp)
        return self._rescale(xq, sx, x.shape[:-1], res, (rows, gate.rows) if gated else None)

    def add_silu_to(self, res, gu, gate=None):
        if not self._c(gu):
            return super().add_silu_to(res, gu, gate)
        lead = gu.shape[:-1]
        a, xq, sx = silu_mul_quant(self._lib, self._rows(gu), self.kp)
        if self.lora is not None and gate is not None:
            if self._c_delta(gate):
                return self._rescale(xq, sx, lead, res, (a, gate.rows))
            return res + self._delta(self._rescale(xq, sx, lead), a.view(*lead, -1), gate)
        return self._rescale(xq, sx, lead, res)


def reference_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The slow, obvious version of `Int8Linear` for one matrix, row by row in int64 (the tests' yardstick)."""
    wq, sw = quantize_weight(w.float())
    rows = []
    for row in x.reshape(-1, x.shape[-1]):
        amax = row.abs().max().clamp_min(torch.finfo(x.dtype).tiny)
        u = (row * (ACT_MAX / amax)).nan_to_num(0.0)  # a zero row: 0 * inf -> 0
        q = torch.round(u)
        r = torch.round((u - q) * RESIDUAL_STEPS)
        assert q.abs().max() <= ACT_MAX and r.abs().max() <= ACT_MAX
        acc_q = (wq.long() * q.long()[None, :]).sum(dim=1)  # (out,) exact
        acc_r = (wq.long() * r.long()[None, :]).sum(dim=1)
        rows.append((acc_q.to(x.dtype) + acc_r.to(x.dtype) / RESIDUAL_STEPS) * (amax / ACT_MAX) * sw.to(x.dtype))
    y = torch.stack(rows)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], w.shape[0])
