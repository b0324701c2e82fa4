"""The int8 fast path's attention and whole-pass layer loop in C (mars/runtime/csrc/layers.c).

    CLayers.of(lm)            -> CLayers, or None where a layer cannot run in C (not int8 on the C kernels,
                                 float32 rows; or gated deltas the C kernels do not take)
    attend(lib, qkv, ...)     rotary + cache write + attention of one layer (a pass too long for `layers`:
                                 the same C attention, so a row's result is the same however wide its pass)
    layers(x, ...)            every layer of a pass of up to MAX_C_ROWS rows in one call

Measured on the default model (2 threads, int8, 128 cached tokens): see docs/int8.md.
"""

from __future__ import annotations

import ctypes

import torch

from mars.runtime.kernels import HEADER, MAX_C_ROWS, MAX_HEAD_DIM, check_tensor, check_row_indices, kernels

LinC, LayerC = HEADER.structs["lin_c"], HEADER.structs["layer_c"]  # as mars_kernels.h lays them out


def attend(lib, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int,
           allowed: torch.Tensor, n_heads: int, n_kv: int) -> torch.Tensor:
    """The rotary, the cache write and attention of one layer's pass, in C (mars_attend).

    qkv (b, W, (H + 2 KV) hd) float32 contiguous, [q heads | k heads | v heads] per row, rotated in place; cos,
    sin (b W, hd) float32, each row's rotary (sin's first half negated: FastLM.rope_table); k, v (b, KV,
    capacity, hd) contiguous, the layer's cache: the window's rotated keys and values go to columns [C, C + W);
    allowed uint8 (b, W, C + W). Returns the attention (b, W, H hd).
    """
    check_tensor("qkv", qkv, torch.float32, (None, None, None))
    b, W = qkv.shape[:2]
    check_tensor("k", k, torch.float32, (b, n_kv, None, None))
    cap, hd = k.shape[2:]
    check_tensor("v", v, torch.float32, (b, n_kv, cap, hd))
    _check_attention(qkv, cos, sin, allowed, b, W, C, cap, hd, n_heads, n_kv)
    out = torch.empty(b, W, n_heads * hd)
    rc = lib.mars_attend(qkv.data_ptr(), b, W, n_heads, n_kv, hd, cos.data_ptr(), sin.data_ptr(), k.data_ptr(),
                         v.data_ptr(), k.shape[2], C, allowed.data_ptr(), out.data_ptr(), None, b * W)
    if rc != 0:
        raise MemoryError("the C attention could not allocate its scratch")
    return out


def _check_attention(qkv, cos, sin, allowed, b: int, W: int, C: int, cap: int, hd: int, n_heads: int, n_kv: int,
                     n: int | None = None):
    """What mars_attend reads and writes, checked before the call (a wrong size writes past a tensor); qkv None:
    made inside the C call (the layer loop); n: the rows computed (None: b W)."""
    n = b * W if n is None else n
    if qkv is not None:
        check_tensor("qkv", qkv, torch.float32, (b, W, (n_heads + 2 * n_kv) * hd))
    check_tensor("cos", cos, torch.float32, (n, hd))
    check_tensor("sin", sin, torch.float32, (n, hd))
    check_tensor("allowed", allowed, torch.uint8, (b, W, C + W))
    if C < 0 or C + W > cap:
        raise ValueError(f"attend: {W} rows after {C} cached ones do not fit the cache's {cap} columns")
    if hd > MAX_HEAD_DIM or hd % 2 or n_kv < 1 or n_heads % n_kv:
        raise ValueError(f"attend: head size {hd} (even, at most {MAX_HEAD_DIM}), {n_heads} heads over {n_kv}")


def _lin(M) -> LinC | None:
    """The C view of an Int8Linear, or None where the layer loop cannot run it."""
    if getattr(M, "_lib", None) is None or not hasattr(M, "wblocked"):
        return None
    if M.lora is not None and M.lora_c is None:
        return None  # deltas kept as float tensor ops (not exactly float16): the Python path adds them
    lw = None if M.lora_c is None else ctypes.addressof(M.lora_c.c)
    return LinC(M.wblocked.data_ptr(), M.wsum.data_ptr(), M.out_features, M.kp, M.scale32.data_ptr(),
                 None if M.bias32 is None else M.bias32.data_ptr(), lw)


class CLayers:
    """The layer structs of one FastLM (they point into its tensors, which the FastLM keeps alive)."""

    max_rows = MAX_C_ROWS  # passes of up to this many rows run `layers`; longer ones layer by layer

    def __init__(self, lm, lib, structs, keep):
        self.lm, self.lib, self.structs, self._keep = lm, lib, structs, keep
        L0 = lm.layers[0]
        self.D = L0.qkv.in_features
        self.I = L0.down.in_features

    @classmethod
    def of(cls, lm) -> "CLayers | None":
        lib = kernels()
        if lib is None or lm.dtype != torch.float32 or lm.embed.device.type != "cpu":
            return None
        if lm.head_dim > MAX_HEAD_DIM or lm.head_dim % 2 or lm.n_heads % lm.n_kv:
            return None  # mars_attend's limits (its rotary's buffer, whole query groups)
        structs = (LayerC * len(lm.layers))()
        keep = []  # tensors the structs point into
        for s, L in zip(structs, lm.layers):
            lins = [_lin(M) for M in (L.qkv, L.o, L.gate_up, L.down)]
            if any(v is None for v in lins):
                return None
            ln1, ln2 = L.ln1.float().contiguous(), L.ln2.float().contiguous()
            keep += [ln1, ln2]
            s.ln1, s.ln2 = ln1.data_ptr(), ln2.data_ptr()
            s.eps1, s.eps2 = L.eps1, L.eps2
            s.qkv, s.o, s.gu, s.down = lins
        return cls(lm, lib, structs, keep)

    def attend(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, layer: int, C: int,
               allowed: torch.Tensor) -> torch.Tensor:
        """One layer's attention on the cache's layer `layer` (see `attend`)."""
        lm = self.lm
        return attend(self.lib, qkv, cos, sin, cache.k[layer], cache.v[layer], C, allowed, lm.n_heads, lm.n_kv)

    def layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, C: int, allowed: torch.Tensor,
               rows: torch.Tensor | None, at: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer on x (b, W, D) contiguous float32, in place (b W <= MAX_C_ROWS); rows: the gated rows
        (int64) or None. Returns x.

        at: only these rows of the pass (b, W, as `allowed` says), flat indices bi W + i, ascending (int64, at most
        MAX_C_ROWS, b too); x, cos, sin and rows are then theirs: x (n, D), cos and sin (n, hd), rows indices into
        x. The others are computed by nobody: no query of the pass may see them (the decoder's padding)."""
        lm = self.lm
        if at is None:
            check_tensor("x", x, torch.float32, (None, None, self.D))
            b, W = x.shape[:2]
            n = b * W
        else:
            b, W = allowed.shape[:2]
            n = at.numel()
            check_tensor("x", x, torch.float32, (n, self.D))
            if b > MAX_C_ROWS:
                raise ValueError(f"the C layer loop takes rows of at most {MAX_C_ROWS} batch rows, got {b}")
            check_row_indices(at, b * W)
            if n > 1 and not bool((at[1:] > at[:-1]).all()):
                raise ValueError("the rows of a pass must be named in ascending order")
        ng = 0 if rows is None else rows.numel()
        if n > MAX_C_ROWS:
            raise ValueError(f"the C layer loop takes at most {MAX_C_ROWS} rows, got {n}")
        shape = (len(self.structs), b, lm.n_kv, cache.capacity, lm.head_dim)
        check_tensor("cache.k", cache.k, torch.float32, shape)
        check_tensor("cache.v", cache.v, torch.float32, shape)
        _check_attention(None, cos, sin, allowed, b, W, C, cache.capacity, lm.head_dim, lm.n_heads, lm.n_kv, n)
        if rows is not None:
            check_row_indices(rows, n)
        rc = self.lib.mars_layers(self.structs, len(self.structs), x.data_ptr(), b, W, self.D, self.I, lm.n_heads,
                                  lm.n_kv, lm.head_dim, cache.k.data_ptr(), cache.v.data_ptr(), cache.capacity, C,
                                  cos.data_ptr(), sin.data_ptr(), allowed.data_ptr(),
                                  None if rows is None else rows.data_ptr(), ng, int(self.lib.amx),
                                  None if at is None else at.data_ptr(), n)
        if rc != 0:
            raise MemoryError("the C layer loop could not allocate its buffers")
        return x
