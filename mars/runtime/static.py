"""The fast path at fixed shapes, so a GPU can replay each pass as one CUDA graph (gpt-fast's recipe).

Why: on a GPU a small model's pass is set by the host, not the arithmetic. Measured on an H200 (FINDINGS,
bfloat16, SmolLM2-135M): an AR pass took 33 ms and a MARS pass 97 ms, while the weights stream in
~60 microseconds: eager per-op launches, masks and positions built on the CPU, cache bookkeeping and
host syncs set the pace. A CUDA graph replays a whole pass with one launch, but only at fixed shapes and
fixed addresses, with no host sync inside. So here:
  - the KV cache is one static buffer per run (`StaticState`): every layer attends over ALL its columns,
    keys past the valid ones masked out, and a pass writes its KV with `index_copy_` at columns given by
    a device tensor (never Python slicing by the cache length);
  - a pass's input is padded to a width bucket (`WIDTHS`) and the batch to `BATCHES`: padded queries see
    only themselves and write KV past the valid columns, which the next pass overwrites;
  - positions and the mask are copied into static device buffers; the rotary table is built once for
    the model's whole context;
  - the gated adapter's gate is a 0/1 multiplier computed on the device (no `gate.any()` sync): whether a
    pass holds any mask is known on the host from its ids, so it picks one of two graphs instead;
  - logits stay on the device: the modes score and accept there (argmax, confidence, the tau rule) and
    bring back only the few ids and confidences they keep (mars.decoding.acceptance.to_host).
`StaticLM.step` is the pass: tensors in, logits out, the KV written in place; it compiles with
`torch.compile(fullgraph=True)` at every bucket (tests/test_static.py, backend "eager"). On CUDA each
(batch, width, gated) shape is captured once as a `torch.cuda.CUDAGraph` and replayed; wider passes
(a long prompt's prefill) run eagerly at their own width. Elsewhere (the CPU) the same padded path runs
without graphs: it is what the tests check token for token against the fast and transformers paths.
On the CPU the decoder keeps `fast` by default: padding costs real arithmetic there.

MARS_STATIC_COMPILE=1 also runs the step through torch.compile (inductor, fewer kernels per pass) before
capture; it needs a working triton on the device and is off by default.
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.nn.functional as F

from mars import settings
from mars.runtime.fastpath import built, fast_model, pack_columns
from mars.runtime.linear import rms_norm
from mars.runtime.scoring import C_SCORING
from mars.runtime.attention import additive_mask

# Pass widths are padded up to one of these. A MARS pass at block size B carries 2..2B-1 inputs, a verified
# pass with every mask group up to ~B^2, a batch's re-fed row up to cache_block + 2B: powers of two keep
# the padding under 2x and the shapes few (dynamo gives up after 8 recompiles of one function).
WIDTHS = (1, 2, 4, 8, 16, 32, 64)
BATCHES = (1, 2, 4, 8, 16, 32, 64)  # a run's batch is padded to one of these (finished rows keep their slot)
MIN_CAPACITY = 256  # cache columns are rounded up to a power of two >= this, so runs of similar length share buffers
IDLE_STATES = 4  # static buffers (and their graphs) kept for the next run of the same shape


def bucket(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest size >= n, or None when n is past the largest (that pass runs at its own width)."""
    return next((s for s in sizes if s >= n), None)


def round_capacity(n: int) -> int:
    cap = MIN_CAPACITY
    while cap < n:
        cap *= 2
    return cap


class StaticState:
    """One run's static buffers: the KV cache (layers, batch, kv_heads, columns, head_dim) and, on CUDA,
    the graphs captured over it (a graph remembers addresses, so it belongs with the buffers it read)."""

    def __init__(self, slm: "StaticLM", batch: int, capacity: int):
        f = slm.fast
        self.batch, self.capacity = batch, capacity  # capacity: valid columns; WIDTHS[-1] more hold padding's KV
        shape = (f.n_layers, batch, f.n_kv, capacity + WIDTHS[-1], f.head_dim)
        with torch.inference_mode():
            # zeros, not empty: a masked key's weight is exactly 0, but 0 * NaN from stale memory is NaN
            self.k = torch.zeros(shape, dtype=f.dtype, device=f.device)
            self.v = torch.zeros(shape, dtype=f.dtype, device=f.device)
        self.length = 0
        self.graphs: dict[tuple[int, bool], _Graph] = {}
        self.pool = None  # one CUDA graph memory pool per state: its graphs never run concurrently

    @property
    def columns(self) -> int:
        return self.k.shape[3]


class _Graph:
    """One captured pass: its static inputs, the CUDA graph, its output buffer."""

    def __init__(self, slm: "StaticLM", state: StaticState, ids, pos, allowed, cols, gated: bool):
        d = slm.fast.device
        self.ids, self.pos, self.allowed, self.cols = (t.to(d) for t in (ids, pos, allowed, cols))
        if state.pool is None:
            state.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # warm-up (cuBLAS workspaces, lazy initialisation, compilation) on a side stream, as capture requires;
        # each run is the real pass (the inputs are this pass's), so its KV writes are the ones wanted
        with torch.cuda.stream(side):
            for _ in range(2):
                slm.run_step(self.ids, self.pos, self.allowed, self.cols, state, gated)
        torch.cuda.current_stream().wait_stream(side)
        # capture records the kernels without running them: `out` holds the logits only after a replay (and
        # replaying the same pass again rewrites the same KV)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the app decodes in worker threads; another thread's CUDA calls do not void this capture
        with torch.cuda.graph(self.graph, pool=state.pool, capture_error_mode="thread_local"):
            self.out = slm.run_step(self.ids, self.pos, self.allowed, self.cols, state, gated)

    def replay(self, ids, pos, allowed, cols) -> torch.Tensor:
        for buf, x in ((self.ids, ids), (self.pos, pos), (self.allowed, allowed), (self.cols, cols)):
            buf.copy_(x, non_blocking=True)
        self.graph.replay()
        return self.out


class StaticLM:
    """The fast path's weights (mars.runtime.fastpath.FastLM) run by a fixed-shape step, and a pool of static
    buffers that successive runs reuse with their graphs."""

    def __init__(self, model, compile_step: bool | None = None):
        self.fast = fast_model(model)
        f = self.fast
        self.device = f.device
        self.graphs_on = self.device.type == "cuda"
        limit = getattr(model.config, "max_position_embeddings", None) or 32768
        with torch.inference_mode():  # the rotary table, once for the whole context
            self.cos, self.sin = f.rope_table(limit)
        self.max_positions = limit
        self.mask_token_id = f.gated.mask_token_id if f.gated is not None else None
        if compile_step is None:
            compile_step = settings.get().static_compile  # MARS_STATIC_COMPILE
        self._step = self.step
        if compile_step:
            # one compiled function serves every (batch, width, gated) shape: raise dynamo's recompile limit
            # (8 by default, past which it silently runs eagerly) to the number of shapes the buckets allow
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                       2 * len(WIDTHS) * len(BATCHES))
            self._step = torch.compile(self.step, fullgraph=True, dynamic=False)
        self._idle: list[StaticState] = []
        self._lock = threading.Lock()
        self.shapes: set[tuple[int, int, bool]] = set()  # (batch, width, gated) of every pass run: tests count them

    def step(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cols: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, gated: bool) -> torch.Tensor:
        """One pass at a fixed shape; pure tensors in, logits out, the window's KV written into k and v.

        ids, positions: (b, W) long. allowed: (b, W, N) bool over ALL N cache columns (True: the query may
        attend to the key); a query's own column included. cols: (W,) long, the columns the window's KV is
        written to (shared by the rows: the decoder's windows sit in shared columns), or (b, W): each row's
        own columns, distinct within a row (mars.runtime.step_runner: rows at their own cache lengths). k, v: (layers, b,
        kv_heads, N, head_dim). gated: whether the gated adapter acts (at rows whose id is the mask token).
        Returns float32 logits (b, W, V) of every window input.
        """
        f = self.fast
        b, W = ids.shape
        H, KV, hd = f.n_heads, f.n_kv, f.head_dim
        mask = additive_mask(allowed, f.dtype)[:, None]  # (b, 1, W, N), built once per pass
        cos, sin = self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)  # (b, W, 1, hd)
        half = hd // 2
        # cols (b, W): a write index per row, the shape scatter_ takes; unique per row (a scatter's order is free)
        per_row = cols[:, None, :, None].expand(b, KV, W, hd) if cols.dim() == 2 else None
        g = (ids == self.mask_token_id).unsqueeze(-1).to(f.dtype) if gated else None  # (b, W, 1) 0/1
        x = F.embedding(ids, f.embed)  # (b, W, D)
        for i, L in enumerate(f.layers):
            h = rms_norm(x, L.ln1, L.eps1)
            qkv = L.qkv(h, g).view(b, W, H + 2 * KV, hd)  # heads: [q (H) | k (KV) | v (KV)]
            qk = qkv[:, :, : H + KV]
            qk = torch.addcmul(qk * cos, qk.roll(half, dims=-1), sin)  # rotary on q and k at once
            ks, vs = k[i], v[i]  # (b, KV, N, hd)
            if per_row is None:
                ks.index_copy_(2, cols, qk[:, :, H:].transpose(1, 2))
                vs.index_copy_(2, cols, qkv[:, :, H + KV:].transpose(1, 2))
            else:  # each row's own columns (the device step: rows at their own cache lengths)
                ks.scatter_(2, per_row, qk[:, :, H:].transpose(1, 2))
                vs.scatter_(2, per_row, qkv[:, :, H + KV:].transpose(1, 2))
            q = qk[:, :, :H].transpose(1, 2)  # (b, H, W, hd)
            att = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, enable_gqa=True)  # (b, H, W, hd)
            x = x + L.o(att.transpose(1, 2).reshape(b, W, H * hd), g)
            h = rms_norm(x, L.ln2, L.eps2)
            gate, up = L.gate_up(h, g).chunk(2, dim=-1)
            x = x + L.down(F.silu(gate) * up, g)
        return f.head(rms_norm(x, f.norm, f.norm_eps)).float()

    def run_step(self, ids, pos, allowed, cols, state: StaticState, gated: bool) -> torch.Tensor:
        return self._step(ids, pos, allowed, cols, state.k, state.v, gated)

    def run(self, state: StaticState, ids, pos, allowed, cols, gated: bool) -> torch.Tensor:
        """One padded pass over `state`: replayed as a CUDA graph where one applies, else run directly."""
        b, W = ids.shape
        self.shapes.add((b, W, gated))
        if not self.graphs_on or W not in WIDTHS:
            d = self.device
            return self.run_step(ids.to(d), pos.to(d), allowed.to(d), cols.to(d), state, gated)
        graph = state.graphs.get((W, gated))
        if graph is None:  # first pass of this shape: capture it over this pass's inputs
            graph = state.graphs[(W, gated)] = _Graph(self, state, ids, pos, allowed, cols, gated)
        return graph.replay(ids, pos, allowed, cols)

    def acquire(self, batch: int, capacity: int) -> StaticState:
        """Static buffers for a run (an idle state of this shape, with its graphs, or a new one)."""
        with self._lock:
            for s in self._idle:
                if s.batch == batch and s.capacity == capacity:
                    self._idle.remove(s)
                    s.length = 0
                    return s
        return StaticState(self, batch, capacity)

    def release(self, state: StaticState):
        with self._lock:
            self._idle.append(state)
            del self._idle[:-IDLE_STATES]  # the oldest go (and their graphs' memory with them)


def static_model(model) -> StaticLM:
    """The StaticLM of `model`, built once beside its fast path (fastpath.built: rebuilt, and the old buffers
    freed, when the weights change)."""
    return built(model, ("static", id(getattr(model, "_mars_gated", None))), lambda: StaticLM(model))


class StaticBackend:
    """The decoder's backend interface (mars.runtime.backends) over a StaticLM; logits stay on the device.

    Rows keep their slot in the padded batch; `select` moves the kept rows' KV to the front slots."""

    scoring = C_SCORING  # on a CPU: one C call per scoring; a GPU's logits fall back to torch ops (on the device)

    def __init__(self, model, batch: int, capacity: int, slm: StaticLM | None = None):
        self.slm = slm or static_model(model)  # slm: a StaticLM of the caller's own (a test counting its shapes)
        bb = bucket(batch, BATCHES) or batch
        self.state = self.slm.acquire(bb, round_capacity(capacity))
        self.rows = batch
        self._finalizer = weakref.finalize(self, self.slm.release, self.state)
        self.pad_id = 0

    @property
    def length(self) -> int:
        return self.state.length

    def forward(self, ids, positions, allowed, keep: list[int]) -> torch.Tensor:
        """ids, positions (b, W), allowed (b, W, C + W) on the CPU, as the decoder builds them; logits
        (b, len(keep), V) float32 on the model's device."""
        b, W = ids.shape
        C = self.length
        if allowed.shape != (b, W, C + W):
            raise ValueError(f"mask shape {tuple(allowed.shape)} != {(b, W, C + W)}")
        if b != self.rows:
            raise ValueError(f"{b} rows fed to a cache of {self.rows} live rows")
        if C + W > self.state.capacity:
            self._grow(C + W)
        if int(positions.max()) >= self.slm.max_positions:  # a host tensor: no device wait
            raise ValueError(f"position {int(positions.max())} is past the model's context of {self.slm.max_positions}")
        st = self.state
        Wp = bucket(W, WIDTHS) or W
        B, N = st.batch, st.columns
        # 1. the padded inputs, built on the host (the decoder's are host tensors) and copied once each
        ids_p = torch.full((B, Wp), self.pad_id, dtype=torch.long)
        ids_p[:b, :W] = ids
        pos_p = torch.zeros((B, Wp), dtype=torch.long)
        pos_p[:b, :W] = positions
        cols = torch.arange(C, C + Wp)
        allowed_p = torch.zeros((B, Wp, N), dtype=torch.bool)
        allowed_p[:b, :W, : C + W] = allowed
        allowed_p[:, torch.arange(Wp), cols] = True  # padded queries see themselves (none sees nothing: NaN)
        gated = self.slm.mask_token_id is not None and bool((ids == self.slm.mask_token_id).any())
        # 2. the pass; 3. the logits asked for, gathered on the device (the graph's output buffer is reused)
        with torch.inference_mode():
            logits = self.slm.run(st, ids_p, pos_p, allowed_p, cols, gated)
            if keep == list(range(keep[0], keep[0] + len(keep))):
                out = logits[:b, keep[0]:keep[0] + len(keep)].clone()  # a copy: the next replay reuses the buffer
            else:  # copied without waiting for the device (a blocking copy would wait for the pass)
                out = logits[:b, torch.tensor(keep).to(logits.device, non_blocking=True)]
        st.length = C + W
        return out

    def truncate(self, n: int):
        if not 0 <= n <= self.state.length:
            raise ValueError(f"cannot truncate a cache of {self.state.length} columns to {n}")
        self.state.length = n

    def select(self, rows: list[int]):
        """Keep these rows, in this order, in the first slots (the others' slots become padding)."""
        st = self.state
        idx = torch.as_tensor(rows, dtype=torch.long, device=st.k.device)
        with torch.inference_mode():
            for buf in (st.k, st.v):
                buf[:, : len(rows)] = buf.index_select(1, idx)  # in place: graphs hold these addresses
        self.rows = len(rows)

    def add_rows(self, n: int):
        """n rows after the live ones: free slots if the padded batch has them, else a bigger batch bucket (new
        buffers and graphs), keeping the live rows' KV."""
        old = self.state
        if self.rows + n > old.batch:
            new = self.slm.acquire(bucket(self.rows + n, BATCHES) or self.rows + n, old.capacity)
            with torch.inference_mode():
                new.k[:, : self.rows, :, : old.length] = old.k[:, : self.rows, :, : old.length]
                new.v[:, : self.rows, :, : old.length] = old.v[:, : self.rows, :, : old.length]
            new.length = old.length
            self._swap(new)
        self.rows += n

    def compact(self, order: torch.Tensor):
        """Row r keeps its columns order[r] (b, n), in that order, as its first n (in place: graphs hold the
        buffers' addresses)."""
        st = self.state
        pack_columns((st.k, st.v), order, st.length)
        st.length = order.shape[1]

    def _swap(self, new: StaticState):
        self._finalizer.detach()
        self.slm.release(self.state)
        self.state = new
        self._finalizer = weakref.finalize(self, self.slm.release, new)

    def _grow(self, need: int):
        """A run longer than planned: move to bigger buffers (new graphs), keeping the valid columns."""
        old = self.state
        new = self.slm.acquire(old.batch, round_capacity(need))
        with torch.inference_mode():
            new.k[:, :, :, : old.length] = old.k[:, :, :, : old.length]
            new.v[:, :, :, : old.length] = old.v[:, :, :, : old.length]
        new.length = old.length
        self._swap(new)
