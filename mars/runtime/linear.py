"""The fast path's matrices: y = x @ W.T (+ b) over the model's own Linear modules (fused side by side), the
gated adapter's deltas at the mask rows (`Gate`), and RMSNorm, as the int8 matrices (mars.runtime.quant)
override them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    # transformers normalises in float32 whatever the model's dtype, then scales in the model's dtype
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


class Linear:
    """y = x @ W.T (+ b) for one or several of the model's Linear modules side by side (fused outputs).

    Two ways to run it, picked by the layout:
      "auto", "packed" : oneDNN matmul on a fused copy packed once (`mkldnn._reorder_linear_weight`), every
                         pass, 1 row included (see `_base` for why not MKL for few rows)
      "linear"         : `F.linear` on the model's own matrices (no copy; MKL), as benchmarks compare it
    Where oneDNN is missing (a GPU, no mkldnn) "auto" runs the model's own matrices. A weight dtype other than
    the model's (bfloat16) always runs packed, or on a converted copy where oneDNN is missing.
    """

    def __init__(self, mods: list, layout: str, dtype: torch.dtype, lora: tuple | None = None):
        w0 = mods[0].weight
        self.lora = lora  # gated adapter (mars.models.gated): (A, B) added at the gated rows only
        self.out_features = sum(m.weight.shape[0] for m in mods)
        self.dtype = dtype
        can_pack = (dtype in (torch.float32, torch.bfloat16) and w0.device.type == "cpu"
                    and torch.backends.mkldnn.is_available())
        pack = can_pack and (layout == "packed" or (layout == "auto" and dtype == w0.dtype) or dtype != w0.dtype)
        own = not pack and dtype == w0.dtype  # no copy; references, not copies, of the model's matrices
        self.parts = None  # [(weight, bias)] used by F.linear
        if own:
            self.parts = [(m.weight.detach(), None if m.bias is None else m.bias.detach()) for m in mods]
            if w0.device.type != "cpu" and len(mods) > 1:  # a GPU: one fused matrix, one kernel (no oneDNN there)
                self.parts = [fuse(mods)]
        elif not pack:
            self.parts = [(m.weight.detach().to(dtype), None if m.bias is None else m.bias.detach().to(dtype))
                          for m in mods]
        self.packed = self.bias = None
        if pack:
            w, bias = fuse(mods)
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype).contiguous(), 4)  # reordered for few rows
            self.bias = None if bias is None else bias.to(dtype)

    def __call__(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """gate: None, or (b, W, 1) in x's dtype, 1 at the rows the gated adapter acts at, 0 elsewhere (or a
        `Gate`, which carries that multiplier)."""
        return self._delta(self._base(x), x, gate)

    # Why the multiplier and not the rows:
    # the delta is computed for every row and multiplied by the gate: a handful of rows cost less that way
    # than gathering and scattering the gated ones, and a real row gets exactly + 0. Folding A into the packed
    # matrix as extra output rows was measured slower (a 5-row pass's matmuls: 1.44x the bare ones folded,
    # 1.20x as here), so A runs as its own small matmul. The int8 matrices' C kernels do take the rows.

    def _delta(self, y: torch.Tensor, x: torch.Tensor, gate: "torch.Tensor | Gate | None") -> torch.Tensor:
        """y + the gated adapter's delta of input x at the gated rows (y unchanged without one)."""
        if self.lora is not None and gate is not None:
            a, b = self.lora
            y.addcmul_((x @ a.T) @ b.T, gate.mult if isinstance(gate, Gate) else gate)
        return y

    # The layer's steps around a matrix, as methods so that the int8 matrices (mars.runtime.quant) can fuse them
    # into their input's quantization and output's rescale; here they are the plain ops.
    def normed(self, x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor | None = None):
        """self(RMSNorm(x) * weight, gate)."""
        return self(rms_norm(x, weight, eps), gate)

    def add_to(self, res: torch.Tensor, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """res + self(x, gate): the residual stream's update."""
        return res + self(x, gate)

    def add_silu_to(self, res: torch.Tensor, gu: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """res + self(silu(g) * u, gate) for gu = [g | u] (the MLP's gate and up halves): its down projection."""
        g, u = gu.chunk(2, dim=-1)
        return self.add_to(res, F.silu(g) * u, gate)

    # Why the packed copy for 1 and 2 rows too (issue 41; SmolLM2-135M, float32, 2 threads, an AVX2-only AMD EPYC,
    # quiet): MKL's routes there were the slow ones. For 1 row `F.linear` is MKL's gemv, which runs the LM head
    # on one thread (cpu/wall 1.00): 8.8 ms against 4.9 on the packed copy; for 2 rows it is MKL's sgemm, which
    # repacks the weight on every call: the head 20.2 ms against 6.2. A whole pass (benchmarks/pass_cost.py,
    # min of 10 rounds, old and new side by side) cost 46-48 ms at 1 row and 81-82 at 2 against 44-46 at 5 rows;
    # on the packed copy 34-35 at 1 row and 36-39 at 2, so core AR no longer costs more a pass than MARS. On
    # 1 thread the packed copy costs what the gemv does at 1 row (46 ms) and less at 2 (51 against 80).
    def _base(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        if self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, self.bias, "none", [], "")
        else:
            xs = x.to(self.dtype)
            ys = [F.linear(xs, w, b) for w, b in self.parts]
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        return y if y.dtype == in_dtype else y.to(in_dtype)


class Gate:
    """The rows a pass's gated adapter acts at (its mask inputs), in the two forms its deltas use: `mult`, a
    (b, W, 1) 0/1 multiplier for the tensor ops, and `rows`, the flat indices of those rows (b * W order) for
    the C kernels of the int8 matrices (mars.runtime.quant), which add the delta at those rows only."""

    __slots__ = ("mult", "rows")

    def __init__(self, is_mask: torch.Tensor, dtype: torch.dtype):
        self.mult = is_mask.unsqueeze(-1).to(dtype)
        self.rows = is_mask.flatten().nonzero().flatten()



def layer_groups(layer) -> dict[str, list]:
    """A decoder layer's matrices as the fast path fuses them, each group's modules reading the same input:
    {"qkv": [q, k, v], "o": [o], "gate_up": [gate, up], "down": [down]} (the int8 rounding names them alike)."""
    a, m = layer.self_attn, layer.mlp
    return {"qkv": [a.q_proj, a.k_proj, a.v_proj], "o": [a.o_proj], "gate_up": [m.gate_proj, m.up_proj],
            "down": [m.down_proj]}


def fuse(mods: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of Linear modules side by side: outputs concatenated (a missing bias is zeros)."""
    w = torch.cat([m.weight.detach() for m in mods])
    if all(m.bias is None for m in mods):
        return w, None
    return w, torch.cat([m.bias.detach() if m.bias is not None else w.new_zeros(m.weight.shape[0]) for m in mods])
