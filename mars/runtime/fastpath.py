"""A lean forward pass for Llama and Qwen2 models, with a preallocated KV cache written by position.

Why: at batch 1 on a CPU, a small model's pass is the time to stream its weights from memory plus the
framework's per-op overhead. Measured on SmolLM2-135M here with the matrix products taken out,
transformers' forward spends about twice this path's overhead (17 vs 8 ms per pass under load; ~4 ms
for this path on a quiet core): module calls, rotate_half, masks, cache bookkeeping. This path runs the
same math over the same weights in fewer ops: RMSNorm is one call, the rotary embedding reads a table
indexed by position ids (built by the model's own rotary module, so every rope variant with a fixed
frequency table comes out the same) and rotates q and k together, attention is PyTorch's SDPA with
grouped KV heads and a mask built once per pass (none at all when every query sees every key, as in AR
at batch 1), and the LM head runs only on the rows the caller keeps.

Matrices (`Linear`): every pass runs oneDNN on a copy packed once, with q/k/v and gate/up fused into one
matrix each. MKL on the model's own matrices is slower at every width: its sgemm repacks the weight on
every call (4 rows cost ~1.6x one row there, ~1.1x on the packed copy), and its 1-row gemv ran on one
thread of two (mars.runtime.linear, `Linear._base`). The price is one more copy of the model's matrices
in memory (~540 MB for SmolLM2-135M in float32). `benchmarks/pass_cost.py` measures all of this.

Numerics follow transformers' (RMSNorm in float32, the model's rotary table), so logits agree to
rounding (relative ~1e-5 in float32, ~1e-15 in float64): only the order of sums differs.
`weight_dtype=torch.bfloat16` stores the matrices in bfloat16 (half the memory traffic, avx512_bf16
matmuls): it changes the numerics, so it is opt-in and never the default. oneDNN runs bfloat16 only on
CPUs with AVX-512 (bw, vl, dq) or AVX-NE-CONVERT; elsewhere (an AVX2-only AMD EPYC, say) asking for it
is refused up front with `bf16_unsupported_reason`'s message instead of failing inside oneDNN.
`weight_dtype=torch.int8` runs mars.runtime.quant's int8 matrices instead (backend "fast-int8"; every CPU).

The KV cache (`KVCache`) has the decoder's verbs: `length`, `truncate(n)` (drop every column >= n:
masks and rejected drafts are simply overwritten by the next pass) and `select(rows)`.
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.nn.functional as F

from mars import settings
from mars.runtime.attention import additive_mask
from mars.runtime.cpu import bf16_unsupported_reason
from mars.runtime.linear import Gate, Linear, layer_groups

SUPPORTED_TYPES = ("llama", "qwen2")
LAYOUTS = ("auto", "packed", "linear")


def unsupported_reason(model) -> str | None:
    """None when `model` can run on this path, else why not (the caller then uses transformers)."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model type {kind!r} (supported: {', '.join(SUPPORTED_TYPES)})"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "not a plain *ForCausalLM (an unmerged adapter wrapper?)"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    rope = getattr(getattr(inner, "rotary_emb", None), "rope_type", None)
    if rope is None or rope in ("dynamic", "longrope"):
        return f"rotary type {rope!r} (its frequencies depend on the sequence length)"
    layer = inner.layers[0]
    if not all(hasattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "unexpected attention module"
    if hasattr(layer.self_attn, "q_norm") or any(type(m).__name__.endswith("Linear") and type(m) is not torch.nn.Linear
                                                 for m in layer.modules()):
        return "layers that are not plain Linear modules"
    return None


def _matrix(mods: list, layout: str, wdtype: torch.dtype, lora: tuple | None = None, qweight=None):
    """The matrix class for this weight dtype: int8 runs mars.runtime.quant's kernel, the rest `Linear`.
    qweight: int8 only, its rounded weights (mars.runtime.int8_weights), or None: rounded to nearest."""
    if wdtype == torch.int8:
        from mars.runtime.quant import Int8Linear  # loaded on first use: int8 builds the C kernels

        return Int8Linear(mods, lora, qweight)
    return Linear(mods, layout, wdtype, lora)


class _Layer:
    def __init__(self, layer, layout: str, wdtype: torch.dtype, gated=None, names: dict | None = None,
                 rounded: dict | None = None, index: int = 0):
        def lin(mods, group):  # fused Linear, with the gated adapter's deltas of these modules when there is one
            lora = gated.fused({names[mod]: mod for mod in mods}) if gated is not None else None
            return _matrix(mods, layout, wdtype, lora, None if rounded is None else rounded[f"{index}.{group}"])

        groups = layer_groups(layer)

        self.ln1 = layer.input_layernorm.weight.detach()  # shared with the model, not copied
        self.ln2 = layer.post_attention_layernorm.weight.detach()
        self.eps1 = layer.input_layernorm.variance_epsilon
        self.eps2 = layer.post_attention_layernorm.variance_epsilon
        self.qkv, self.o, self.gate_up, self.down = (lin(groups[g], g) for g in ("qkv", "o", "gate_up", "down"))


def pack_columns(bufs, order: torch.Tensor, length: int):
    """In place, for each KV buffer (layers, batch, kv_heads, columns, head_dim): batch row r's columns order[r]
    (order: (b, n) long, into its first `length` columns) become its columns [0, n); rows past b are left as they
    are. The fast cache's and the static one's packing (mars.decoding.cache.BlockCache.compact)."""
    b, n = order.shape
    with torch.inference_mode():  # the caches' tensors are the forward's (inference tensors)
        for buf in bufs:
            idx = order.to(buf.device)[None, :, None, :, None].expand(buf.shape[0], b, buf.shape[2], n, buf.shape[4])
            buf[:, :b, :, :n] = buf[:, :b, :, :length].gather(3, idx)


class KVCache:
    """Keys and values of every layer, preallocated: k, v (layers, b, kv_heads, capacity, head_dim).

    Columns [0, length) are valid. A forward pass writes its W columns at [length, length + W) and
    advances `length`; `truncate` then keeps what the caller commits. Nothing is ever copied to drop KV.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device=None):
        shape = (layers, batch, kv_heads, capacity, head_dim)
        # zeros: a column a row never wrote (a hole, the padding it skipped) is masked, but 0 x stale NaN is NaN
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def reserve(self, n: int):
        """Make room for n columns (doubling), keeping the valid ones."""
        if n <= self.capacity:
            return
        cap = max(n, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[:3] + (cap,) + old.shape[4:])  # zeros: see add_rows
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)

    def truncate(self, n: int):
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} columns to {n}")
        self.length = n

    def select(self, rows: torch.Tensor | list[int]):
        """Keep these batch rows, in this order: their valid columns copied (not the whole capacity: a batch of 32
        rows holds ~0.75 GB at 512 columns, most of it not yet written)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.k.device)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], rows.numel()) + old.shape[2:])
            new[:, :, :, : self.length] = old[:, :, :, : self.length].index_select(1, rows)
            setattr(self, name, new)

    def add_rows(self, n: int):
        """n rows at the end of the batch, zeros: a hole is never attended, but 0 times stale NaN is still NaN."""
        for name in ("k", "v"):
            old = getattr(self, name)
            setattr(self, name, torch.cat([old, old.new_zeros((old.shape[0], n) + old.shape[2:])], dim=1))

    def compact(self, order: torch.Tensor):
        """Row r keeps its valid columns order[r] (b, n), in that order, as columns [0, n)."""
        pack_columns((self.k, self.v), order, self.length)
        self.length = order.shape[1]

    def gather(self, cols: list[int]):
        """Keep the valid columns `cols`, in this order, as columns [0, len(cols)) (the rest go). A row's
        attention reads its allowed keys in column order, so a gather that keeps each row's keys in order
        changes no result, only which keys sit side by side."""
        if any(not 0 <= c < self.length for c in cols):
            raise ValueError(f"columns must be in [0, {self.length})")
        idx = torch.as_tensor(cols, dtype=torch.long, device=self.k.device)
        n = idx.numel()
        with torch.inference_mode():  # the cache's tensors are the forward's (inference tensors)
            self.k[:, :, :, :n] = self.k.index_select(3, idx)
            self.v[:, :, :, :n] = self.v.index_select(3, idx)
        self.length = n


class FastLM:
    """The lean forward over one transformers model's weights (see the module docstring)."""

    def __init__(self, model, weight_dtype: torch.dtype | None = None, layout: str = "auto",
                 c_layers: bool | None = None, calibrate: bool = True):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"the fast path does not support this model: {reason}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if weight_dtype == torch.bfloat16 and next(model.parameters()).device.type == "cpu":
            reason = bf16_unsupported_reason()
            if reason:  # refuse here, not with oneDNN's error from deep inside the first matmul
                raise ValueError(reason)
        cfg = model.config
        inner = model.model
        self.dtype = next(model.parameters()).dtype  # activations and KV cache
        self.weight_dtype = weight_dtype or self.dtype
        self.layout = layout
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_layers = len(inner.layers)
        self.embed = inner.embed_tokens.weight.detach()  # shared with the model
        self.norm = inner.norm.weight.detach()
        self.norm_eps = inner.norm.variance_epsilon
        # a gated adapter (mars.models.gated) acts only at mask-token rows: kept apart, never merged
        self.gated = getattr(model, "_mars_gated", None)
        names = {mod: name for name, mod in model.named_modules()} if self.gated is not None else None
        # int8: the weights rounded with error feedback on the model's own calibration text, cached on disk
        # (mars.runtime.int8_weights); calibrate=False: each weight rounded to its nearest grid point
        rounded = None
        if self.weight_dtype == torch.int8 and calibrate:
            from mars.runtime.int8_weights import rounded_weights

            rounded = rounded_weights(model)
        self.layers = [_Layer(layer, layout, self.weight_dtype, self.gated, names, rounded, i)
                       for i, layer in enumerate(inner.layers)]
        self.head = _matrix([model.lm_head], layout, self.weight_dtype, None, None if rounded is None else rounded["head"])
        self._rotary = inner.rotary_emb
        self._cos = self._sin = torch.empty(0)
        self.device = self.embed.device
        # int8 on the C kernels: the layer loop and attention in C (mars.runtime.cpu_layers); else None. c_layers None:
        # on unless MARS_C_LAYERS=0; False: the per-layer tensor ops (SDPA), as benchmarks compare them
        self.c_layers = None
        if c_layers is None:
            c_layers = settings.get().c_layers
        if self.weight_dtype == torch.int8 and c_layers:
            from mars.runtime.cpu_layers import CLayers

            self.c_layers = CLayers.of(self)

    def _c_forward(self, x: torch.Tensor, cos, sin, allowed, g, cache: KVCache, C: int) -> torch.Tensor:
        """The layers in C (mars.runtime.cpu_layers), x updated in place: a pass of up to MAX_C_ROWS rows in one
        call; a longer one whose mask lets it (a prompt) in pieces of up to MAX_C_ROWS rows, one call each, in
        order (each row's result does not depend on what else is in its pass, so its bits are those of the
        whole-pass loop; a 35-token prompt 44 -> 32 ms, 20 tokens 36 -> 21 ms, default model, 2 threads); else
        layer by layer with the matrices from Python and the attention in C. cos, sin: the pass's rotary rows
        from _rope (b, W, 1, hd)."""
        b, W, _ = x.shape
        n = b * W
        cos, sin = cos.reshape(n, -1), sin.reshape(n, -1)  # views: _rope's gathers are contiguous
        al = allowed.contiguous().view(torch.uint8)
        rows = None if g is None else g.rows
        most = self.c_layers.max_rows
        if n <= most and (rows is None or rows.numel() <= most):
            return self.c_layers.layers(x, cos, sin, cache, C, al, rows)
        spans = _causal_spans(al, C, most // b if b <= most else 0)
        if spans:  # a prompt: the C loop a few columns at a time, as each row's result does not depend on its pass
            cs, sn = cos.view(b, W, -1), sin.view(b, W, -1)
            for i0, i1 in spans:
                part = x[:, i0:i1].contiguous()
                w = b * (i1 - i0)
                c, s = cs[:, i0:i1].reshape(w, -1).contiguous(), sn[:, i0:i1].reshape(w, -1).contiguous()
                self.c_layers.layers(part, c, s, cache, C + i0, al[:, i0:i1, :C + i1].contiguous(),
                                     _rows_in(rows, W, i0, i1))
                x[:, i0:i1] = part
            return x
        for i, L in enumerate(self.layers):
            qkv = L.qkv.normed(x, L.ln1, L.eps1, g).contiguous()
            att = self.c_layers.attend(qkv, cos, sin, cache, i, C, al)
            y = L.o.add_to(x, att, g)
            y = L.down.add_silu_to(y, L.gate_up.normed(y, L.ln2, L.eps2, g), g)
            x.copy_(y)
        return x

    def _c_forward_rows(self, x: torch.Tensor, cos, sin, allowed, g, cache: KVCache, C: int, live: torch.Tensor,
                        keep: torch.Tensor) -> torch.Tensor:
        """The C layers on the pass's rows `live` only (flat b W indices, ascending); then the LM head on the kept
        ones. Each row's result is its own (the kernels work row by row; the attention reads only the keys a query
        may see), so they are the bits of the whole pass; the padding costs nothing.

        More than MAX_C_ROWS live rows (a room of visitors, several prompts at once) go in pieces of at most that
        many, taken column by column: a query sees only keys of its own batch row at its column or before (its
        window's causal, tree and group masks), so every key a piece reads was written, at every layer, by that
        piece or an earlier one. Same bits, one call a piece (a 29-row pass of ~120 inputs: ~300 ms through the
        per-layer route it took before, ~80 ms so)."""
        b, W, D = x.shape
        n = live.numel()
        at = torch.full((b * W,), -1, dtype=torch.long)  # pass row -> its row in xs (-1: not computed)
        at[live] = torch.arange(n)
        xs = x.view(b * W, D)[live]  # (n, D)
        cs, sn = cos.reshape(b * W, -1)[live], sin.reshape(b * W, -1)[live]  # (n, hd)
        gated = None  # per pass row: is it a gated (mask) row
        if g is not None:
            gated = torch.zeros(b * W, dtype=torch.bool)
            gated[g.rows] = True
        al = allowed.contiguous().view(torch.uint8)
        most = self.c_layers.max_rows
        if n <= most:
            pieces = [torch.arange(n)]
        else:  # indices into xs, column by column, then ascending inside each piece (the C call's order)
            by_column = torch.argsort((live % W) * b + live // W, stable=True)
            pieces = [piece.sort().values for piece in by_column.split(most)]
        for piece in pieces:
            sub = live[piece]
            rows = None
            if gated is not None and bool(gated[sub].any()):
                rows = gated[sub].nonzero().flatten().contiguous()
            part = xs[piece].contiguous() if len(pieces) > 1 else xs
            self.c_layers.layers(part, cs[piece].contiguous(), sn[piece].contiguous(), cache, C, al, rows,
                                 sub.contiguous())
            if len(pieces) > 1:
                xs[piece] = part
        cache.length = C + W
        idx = at.view(b, W)[:, keep]  # (b, K)
        out = self.head.normed(xs[idx.clamp(min=0)], self.norm, self.norm_eps)  # (b, K, V)
        out[idx < 0] = 0  # padding nobody reads
        return out

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return KVCache(self.n_layers, batch, self.n_kv, self.head_dim, capacity, self.dtype, self.device)

    def _rope(self, positions: torch.Tensor):
        """cos, sin (b, W, 1, head_dim) for these position ids, from a table built by the model's rotary module.

        transformers rotates by x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1]; the same
        products come out of x.roll(hd/2) * [-sin1, sin2], one kernel instead of three, so the table holds
        sin with its first half negated.
        """
        need = int(positions.max()) + 1
        if need > self._cos.shape[0]:
            self._cos, self._sin = self.rope_table(max(need, 2 * self._cos.shape[0], 1024))
        return self._cos[positions].unsqueeze(2), self._sin[positions].unsqueeze(2)

    def rope_table(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n, head_dim) for positions 0..n-1, sin with its first half negated (see `_rope`)."""
        probe = torch.empty(1, dtype=self.dtype, device=self.device)
        cos, sin = self._rotary(probe, torch.arange(n, device=self.device)[None])  # (1, n, hd) each
        half = self.head_dim // 2
        return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, keep: torch.Tensor,
                cache: KVCache, padding: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (b, len(keep), V) of window inputs `keep`; appends the window's KV to `cache`.

        ids, positions: (b, W). allowed: bool (b, W, C + W), True where a query may attend to a key, keys
        being the C cached columns then the window. keep: window indices whose logits are wanted. padding:
        None, or bool (b, W), True at inputs nobody reads (no query sees them, their logits are not wanted):
        the C layers then skip them (a batch's right-aligned windows), their logits come back as zeros and
        their KV columns hold whatever was there.
        """
        b, W = ids.shape
        C = cache.length
        H, KV, hd = self.n_heads, self.n_kv, self.head_dim
        if allowed.shape != (b, W, C + W):
            raise ValueError(f"mask shape {tuple(allowed.shape)} != {(b, W, C + W)}")
        cache.reserve(C + W)
        mask = None  # SDPA's fast case: every query sees every key (AR at batch 1)
        if self.c_layers is None and not bool(allowed.all()):  # additive, built once per pass rather than from a bool mask per layer
            mask = additive_mask(allowed, self.dtype)[:, None]  # (b, 1, W, C+W)
        cos, sin = self._rope(positions)  # (b, W, 1, hd)
        half = hd // 2
        g = None  # rows the gated adapter acts at (none: no mask in this pass)
        if self.gated is not None:
            is_mask = ids == self.gated.mask_token_id
            g = Gate(is_mask, self.dtype) if bool(is_mask.any()) else None
        x = F.embedding(ids, self.embed)  # (b, W, D)
        live = None if padding is None or self.c_layers is None else (~padding.cpu()).flatten().nonzero().flatten()
        if live is not None and 0 < live.numel() < b * W and b <= self.c_layers.max_rows:
            return self._c_forward_rows(x, cos, sin, allowed, g, cache, C, live, keep)
        if self.c_layers is not None:
            self._c_forward(x, cos, sin, allowed, g, cache, C)
        else:
            for i, L in enumerate(self.layers):
                qkv = L.qkv.normed(x, L.ln1, L.eps1, g).view(b, W, H + 2 * KV, hd)  # heads: [q (H) | k (KV) | v (KV)]
                qk = qkv[:, :, : H + KV]
                qk = torch.addcmul(qk * cos, qk.roll(half, dims=-1), sin)  # rotary on q and k at once
                ks, vs = cache.k[i], cache.v[i]  # (b, KV, capacity, hd)
                ks[:, :, C:C + W] = qk[:, :, H:].transpose(1, 2)
                vs[:, :, C:C + W] = qkv[:, :, H + KV:].transpose(1, 2)
                q = qk[:, :, :H].transpose(1, 2)  # (b, H, W, hd)
                att = F.scaled_dot_product_attention(q, ks[:, :, : C + W], vs[:, :, : C + W], attn_mask=mask,
                                                     enable_gqa=True)  # (b, H, W, hd)
                x = L.o.add_to(x, att.transpose(1, 2).reshape(b, W, H * hd), g)
                x = L.down.add_silu_to(x, L.gate_up.normed(x, L.ln2, L.eps2, g), g)
        cache.length = C + W
        return self.head.normed(x[:, keep], self.norm, self.norm_eps)  # (b, K, V): only the rows asked for


def _causal_spans(allowed: torch.Tensor, C: int, width: int) -> list[tuple[int, int]] | None:
    """Window columns [i0, i1) in pieces of `width`, where no row of a piece sees a later piece's keys (a
    prompt's causal mask): each piece can then run as a pass of its own after the pieces before it, its keys
    written to the cache first. None where the window cannot be split so (or width < 1)."""
    W = allowed.shape[1]
    if width < 1 or W <= width:
        return None
    spans = [(i0, min(i0 + width, W)) for i0 in range(0, W, width)]
    if any(bool(allowed[:, i0:i1, C + i1:].any()) for i0, i1 in spans[:-1]):
        return None
    return spans


def _rows_in(rows: torch.Tensor | None, W: int, i0: int, i1: int) -> torch.Tensor | None:
    """The gated rows (flat indices b * W + i) that fall in columns [i0, i1), as indices into that piece."""
    if rows is None:
        return None
    bi, i = rows // W, rows % W
    inside = (i >= i0) & (i < i1)
    if not bool(inside.any()):
        return None
    return (bi[inside] * (i1 - i0) + i[inside] - i0).contiguous()


_BUILT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {key: (fingerprint, built)}
_LOCK = threading.RLock()  # a build may ask for another (the static path's is built over the fast one)


def _fingerprint(model) -> tuple:
    # a parameter replaced, or changed in place (optimizer step, adapter merge), changes this
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def built(model, key: tuple, build):
    """The runtime's one model cache: what `build()` makes for `model` under `key` (its fast path, its static
    path), made once and made again when the weights change; freed with the model."""
    with _LOCK:
        builds = _BUILT.setdefault(model, {})
        fp = _fingerprint(model)
        for k in [k for k, (f, _) in builds.items() if f != fp]:
            del builds[k]  # built from older weights: free its memory
        if key not in builds:
            builds[key] = (fp, build())
        return builds[key][1]


def fast_model(model, weight_dtype: torch.dtype | None = None, layout: str = "auto",
               c_layers: bool | None = None, calibrate: bool = True) -> FastLM:
    """The FastLM of `model`, built once (it copies the matrices) and rebuilt when the weights change."""
    key = (weight_dtype, layout, id(getattr(model, "_mars_gated", None)), c_layers, calibrate)
    return built(model, key, lambda: FastLM(model, weight_dtype, layout, c_layers, calibrate))
