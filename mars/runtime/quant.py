"""int8 matrices for the fast path (`backend="fast-int8"`): a quarter of float32's bytes per pass.

Why: at batch 1 on a CPU a small model's pass is the time to stream its weights. Measured here (the default
model's 121 matrices, 2 threads): float32 `F.linear` 23 ms for 1 row and ~48 ms for 5; `torch._int_mm`
(int8 x int8 -> int32, oneDNN) 12 ms for 1 row and ~14 ms for 5. torch's weight-only int8 kernel was 4x
slower than float32, and fbgemm's dynamic quantization uses one activation scale per pass, which couples
the rows (a row's output would depend on the other rows of its pass: batch != alone, verified != AR).

The rule, per Linear (q|k|v and gate|up fused, as in the packed float layout), one int8 row per token:
    W_q = round(W / s_w) in [-WEIGHT_MAX, WEIGHT_MAX]   s_w = max|W[o, :]| / WEIGHT_MAX   (per output channel)
          (a model's FastLM rounds with error feedback on calibration text instead of to the nearest point:
          mars.runtime.int8_weights; the grid and the kernels are the same)
    O   = the OUTLIERS columns of largest |x[r, j]|      (per row, each pass: LLM.int8()'s decomposition)
    x_q = round(x / s_x) in [-127, 127], 0 on O          s_x = max_{j not in O} |x[r, j]| / 127
    y   = (x_q @ W_q.T * s_x + sum_{j in O} x[r, j] * W_q[:, j]) * s_w  (+ bias)
The few largest values of a row are what set an 8-bit row's step (a transformer's activations have a few
channels tens of times the rest); carried apart in float, against the same int8 weights, they leave the rest
a step several times finer. Every row is quantized on its own and the integer products are exact, so a row's
output is the same whatever else is in its pass: batch = alone and verified = this model's AR greedy hold
token for token.

Quality (docs/int8.md): KL to float32's next-token distribution, teacher-forced on its greedy text, 12
held-out prompts, the default model: an 8-bit row alone 0.035 (7-bit weights 0.016 of it); SmoothQuant's
per-channel migration (arXiv 2211.10438) only reached 0.050 (alpha 0.5; higher alphas were worse, the 7-bit
weights taking the range); two int8 rows per token (the value and the residual of its rounding, ~16 bits:
this module before) 0.0155, at twice the integer work. `benchmarks/int8_quality.py` (greedy text's NLL under
float32 over float32 greedy's, 20 held-out prompts): one 8-bit row 1.055x (the bar is 1.03x); two rows
0.940x; one row and 8 outliers 0.960x (16 outliers: 0.940x, not worth their cost). Most of what was left
was the weights' rounding, not the rows': rounded with error feedback (mars.runtime.int8_weights) the same
format gave 0.869x and known answers 9/20 (float32 8/20), 30/80 (float32 28/80).

Which kernels (2 threads, the default model):
  - the C product (mars.runtime.kernels: AVX-512 VNNI, AVX2 or AMX instructions on weights blocked by output
    channel, the rescale and the outliers fused in), up to MAX_C_ROWS rows a call, longer passes (a prompt,
    a wide batch) in tiles of MAX_C_ROWS rows: the same bits for a row either way;
  - with no C compiler (or rows that are not float32): oneDNN's int8 linear on weights packed once
    (`torch._int_mm` where it is missing) for the integer sums, tensor ops for the rest: the same integers,
    floats equal to rounding. oneDNN was 12.5 ms for one token on AMX but 49.5 ms on an AVX2-only CPU.
The rows are quantized and the sums rescaled by C loops too (RMSNorm, SiLU * up and the residual add fused
in); with no C compiler the same steps run as tensor ops (~2x the overhead).

Why 7 bits of weight (WEIGHT_MAX = 64) and not 8: on CPUs without VNNI (AVX2-only, AVX-512 before Cascade
Lake) oneDNN multiplies u8 x s8 pairs with vpmaddubsw, whose 16-bit sums saturate: with full-range weights
`_int_mm` returned wrong integers there (checked with ONEDNN_MAX_CPU_ISA=AVX2); the C product's AVX2 path uses
the same instruction. With |W_q| <= 64 a pair's sum
is at most 2 * 255 * 64 = 32640 < 2^15, so every CPU computes the same exact integers, and the int8 model's
text is the same on the Space's AVX2 machine as here.

The gated adapter's deltas (mars.models.gated) are stored in int8 with a float scale per row of A and per
output of B (mars.runtime.kernels.quantize_lora: half the bytes of its float16), added in float after the
int8 product at the mask rows only.
"""

from __future__ import annotations

import torch

from mars.runtime.kernels import (MAX_C_ROWS, OUTLIERS, LoraWeights, QRows, block_weights, dequantized_lora,
                                   gemv_rows, kernels, padded, quant_rows, rmsnorm_quant, silu_mul_quant)
from mars.runtime.linear import Gate, Linear, fuse

WEIGHT_MAX = 64  # |W_q| bound: exact integer products on every x86 ISA (see the module docstring)
ACT_MAX = 127


def weight_scale(w: torch.Tensor) -> torch.Tensor:
    """s_w float (out,): the int8 grid's step, one per output channel (row of W), symmetric."""
    return w.abs().amax(dim=1).clamp_min(torch.finfo(w.dtype).tiny) / WEIGHT_MAX


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_q int8 (out, in), s_w float (out,)): each weight rounded to its nearest point of weight_scale's grid."""
    scale = weight_scale(w)
    q = torch.round(w / scale[:, None]).clamp_(-WEIGHT_MAX, WEIGHT_MAX).to(torch.int8)
    return q, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows x (n, k) -> (x_q int8 (n, k), s_x (n,), outlier values (n, OUTLIERS) in x's dtype, their columns
    (n, OUTLIERS) int64), as the module docstring's rule: the OUTLIERS largest |x| of a row (the earlier column
    first among equal ones; slots past k hold 0 at column 0) apart, the rest at 8 bits. The C kernels' quant_row
    gives the same bits (float32)."""
    n, k = x.shape
    tiny = torch.finfo(x.dtype).tiny
    order = torch.sort(x.abs(), dim=1, descending=True, stable=True).indices  # by |x|, ties: earlier first
    top = min(OUTLIERS, k)
    oi = torch.zeros(n, OUTLIERS, dtype=torch.long)
    oi[:, :top] = order[:, :top]
    ov = torch.zeros(n, OUTLIERS, dtype=x.dtype)
    ov[:, :top] = x.gather(1, order[:, :top])
    rest = x.scatter(1, order[:, :top], 0.0)
    amax = x.abs().gather(1, order[:, OUTLIERS:OUTLIERS + 1])[:, 0] if k > OUTLIERS else x.new_zeros(n)
    zero = ~(amax >= tiny)  # nothing left but zeros: all zeros, and a finite scale
    inv = torch.where(zero, 0.0, amax.reciprocal() * ACT_MAX)  # as the C: (1 / amax) * 127
    q = (rest * inv[:, None]).clamp_(-ACT_MAX, ACT_MAX).round_().to(torch.int8)
    sx = torch.where(zero, torch.tensor(tiny, dtype=x.dtype) / ACT_MAX, amax / ACT_MAX)
    return q, sx, ov, oi


def outlier_sums(ov: torch.Tensor, oi: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """(n, out): sum over each row's outliers, in order, of value * W_q[:, column] (the C's order)."""
    cols = qweight.t()[oi].to(ov.dtype)  # (n, OUTLIERS, out)
    out = ov[:, 0, None] * cols[:, 0]
    for c in range(1, OUTLIERS):
        out = out + ov[:, c, None] * cols[:, c]
    return out


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

    Activation rows run as one int8 row each and its OUTLIERS largest values in float (`quantize_rows`). Per
    call: quantize the rows, one integer product, rescale. Where the C kernels run (float32 rows) every pass
    runs the C product (mars.runtime.kernels) on its blocked copy of the weights, MAX_C_ROWS rows a call;
    elsewhere oneDNN's int8 linear on weights packed once (`torch._int_mm` where oneDNN's is missing), scaled
    by 1 so that it returns the exact integer sums as float32 (|sum| <= 1536 * 127 * 64 < 2^24 for this
    model's widths), then tensor ops. Both int8 copies are kept (the plain one for the tensor ops: the int8
    weights' bytes twice, still half of float32's)."""

    def __init__(self, mods: list, lora: tuple | None = None, qweight: torch.Tensor | None = None):
        """qweight: the fused weights already rounded on quantize_weight's grid (int8 (out, in), |W_q| <=
        WEIGHT_MAX: mars.runtime.int8_weights rounds them with error feedback), or None: each weight rounded to
        its nearest grid point here."""
        if mods[0].weight.device.type != "cpu":  # CUDA's _int_mm wants > 16 rows: no use for decoding
            raise ValueError("backend 'fast-int8' runs on a CPU only; use 'auto' (or 'fast') on this device")
        w, self.bias = fuse(mods)  # (out, in): q|k|v or gate|up side by side, and their bias (or None)
        w = w.float()
        dtype = mods[0].weight.dtype
        # the gated deltas in int8 (kernels.quantize_lora: half the bytes of the adapter's float16, and the delta's
        # cost at a pass with mask rows is streaming them), as floats for Linear's tensor ops, so that the C
        # kernels and the tensor ops add the same delta to rounding
        self.lora = None if lora is None else tuple(t.to(dtype) for t in dequantized_lora(*lora))
        self.out_features = w.shape[0]
        self.in_features = w.shape[1]
        self.dtype = torch.int8
        if qweight is None:
            qweight, scale = quantize_weight(w)
        elif qweight.dtype != torch.int8 or qweight.shape != w.shape or int(qweight.short().abs().max()) > WEIGHT_MAX:
            raise ValueError(f"rounded weights must be int8 {tuple(w.shape)} with |W_q| <= {WEIGHT_MAX}, got "
                             f"{qweight.dtype} {tuple(qweight.shape)}")
        else:
            scale = weight_scale(w)  # the grid they were rounded on
        self.scale = scale.to(dtype)
        self.scale32 = scale  # float32, for the C rescale
        self.bias32 = None if self.bias is None else self.bias.float().contiguous()
        self._lib = kernels() if dtype == torch.float32 else None  # the C loops run float32 rows only
        self.kp = padded(self.in_features) if self._lib is not None else self.in_features
        self.qweight = qweight  # (out, in): the tensor ops' outlier columns and integer sums
        self.packed = None  # oneDNN's copy, packed on the tensor ops' first product
        if self._lib is not None:  # the C product's copy: blocked by output channels, zero-padded, and row sums
            self.wblocked, self.wsum = block_weights(self._lib, qweight)
        # the gated deltas for the C kernels (at the gated rows only), or None: then the tensor ops of
        # Linear._delta add them
        self.lora_c = None
        if self._lib is not None and lora is not None:
            self.lora_c = LoraWeights.of(*lora, [m.weight.shape[0] for m in mods])

    def _sums(self, xq: torch.Tensor) -> torch.Tensor:
        """(n, in) uint8 rows (value + 128) -> (n, out) float32 exact integer sums against the weights."""
        if self.packed is None and onednn_int8():
            self.packed = torch.ops.onednn.qlinear_prepack(self.qweight, [1, self.in_features])
            self._ones = torch.ones(self.out_features)
            self._zeros = torch.zeros(self.out_features, dtype=torch.long)
        if self.packed is not None:
            return torch.ops.onednn.qlinear_pointwise(xq, 1.0, 128, self.packed, self._ones, self._zeros, None,
                                                      1.0, 0, torch.float32, "none", [], "")
        # _int_mm wants (in, out): the transposed view of the row-major (out, in) copy was the fastest layout
        # measured (12 ms a 1-row pass against 17 ms for a contiguous (in, out) copy)
        return torch._int_mm((xq ^ 128).view(torch.int8), self.qweight.t()).float()

    def _c(self, x: torch.Tensor) -> bool:
        return self._lib is not None and x.dtype == torch.float32

    @staticmethod
    def _rows(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, x.shape[-1])
        return x if x.stride(-1) == 1 else x.contiguous()

    def _rescale(self, xq: QRows, lead, res=None, delta=None) -> torch.Tensor:
        """The C product of rows xq and its rescale, MAX_C_ROWS rows a call (a row's bits do not depend on its
        tile). delta: None, or (the input rows, gated row indices): the gated delta added at those rows in
        the same call."""
        res = None if res is None else self._rows(res)
        n = xq.n
        y = torch.empty(n, self.out_features)
        for i0 in range(0, n, MAX_C_ROWS):
            i1 = min(n, i0 + MAX_C_ROWS)
            d = None
            if delta is not None:
                h, rows = delta
                inside = rows[(rows >= i0) & (rows < i1)]
                if inside.numel():
                    d = (h[i0:i1], (inside - i0).contiguous(), self.lora_c)
            gemv_rows(self._lib, xq.tile(i0, i1), self.wblocked, self.wsum, self.scale32, self.bias32,
                      None if res is None else res[i0:i1], d, out=y[i0:i1])
        return y.view(*lead, self.out_features)

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if self._c(x):
            return self._rescale(quant_rows(self._lib, self._rows(x), self.kp), lead)
        x = x.reshape(-1, x.shape[-1])
        q, sx, ov, oi = quantize_rows(x)
        acc = self._sums(q.view(torch.uint8) ^ 128).to(x.dtype)  # exact integers, one pass over W
        y = (acc * sx[:, None] + outlier_sums(ov, oi, self.qweight)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.view(*lead, self.out_features)

    # The layer's steps fused into the C loops (float32 rows); where they cannot run, Linear's plain ops.
    # The gated delta: by the C kernels at the gated rows only, after the product and its residual (in the
    # product's call), or by Linear's tensor ops, the residual then added after it. Either way a real row's
    # floats are the same (no delta, or + 0 exactly); a mask row's differ by rounding (the order of the sums).
    def _c_delta(self, gate) -> bool:
        """Whether the C kernels add this pass's delta (else the tensor ops, or there is none)."""
        return self.lora_c is not None and isinstance(gate, Gate)

    def normed(self, x, weight, eps, gate=None):
        if not self._c(x):
            return super().normed(x, weight, eps, gate)
        lead = x.shape[:-1]
        h, xq = rmsnorm_quant(self._lib, self._rows(x), weight, eps, self.kp)
        if self._c_delta(gate):
            return self._rescale(xq, lead, delta=(h, gate.rows))
        return self._delta(self._rescale(xq, lead), h.view(*lead, -1), gate)

    def add_to(self, res, x, gate=None):
        if not self._c(x):
            return super().add_to(res, x, gate)
        rows = self._rows(x)
        gated = self.lora is not None and gate is not None
        if gated and not self._c_delta(gate):
            return super().add_to(res, x, gate)
        xq = quant_rows(self._lib, rows, self.kp)
        return self._rescale(xq, x.shape[:-1], res, (rows, gate.rows) if gated else None)

    def add_silu_to(self, res, gu, gate=None):
        if not self._c(gu):
            return super().add_silu_to(res, gu, gate)
        lead = gu.shape[:-1]
        a, xq = silu_mul_quant(self._lib, self._rows(gu), self.kp)
        if self.lora is not None and gate is not None:
            if self._c_delta(gate):
                return self._rescale(xq, lead, res, (a, gate.rows))
            return res + self._delta(self._rescale(xq, lead), a.view(*lead, -1), gate)
        return self._rescale(xq, lead, res)


def reference_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The slow, obvious version of `Int8Linear` for one matrix, row by row in int64 (the tests' yardstick)."""
    wq, sw = quantize_weight(w.float())
    rows = []
    for row in x.reshape(-1, x.shape[-1]):
        order = sorted(range(row.numel()), key=lambda j: (-abs(float(row[j])), j))  # by |x|, ties: earlier first
        out, rest = order[:OUTLIERS], order[OUTLIERS:]
        amax = row[rest].abs().max() if rest else row.new_zeros(())
        q = torch.zeros(row.numel(), dtype=torch.long)
        if amax >= torch.finfo(x.dtype).tiny:
            q[rest] = torch.round(row[rest] * (ACT_MAX / amax)).long()
        assert q.abs().max() <= ACT_MAX
        acc = (wq.long() * q[None, :]).sum(dim=1)  # (out,) exact
        big = sum(((row[j] * wq[:, j].to(x.dtype)) for j in out), torch.zeros(w.shape[0], dtype=x.dtype))
        rows.append((acc.to(x.dtype) * (amax / ACT_MAX) + big) * sw.to(x.dtype))
    y = torch.stack(rows)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], w.shape[0])
