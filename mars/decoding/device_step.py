"""A decoding step that never waits for the host: the pass's inputs, the scoring, the acceptance, the KV commit
and the next pass's inputs, as tensor ops at fixed shapes, for the modes ar, mars, verified (a chain of
mask drafts) and verified with a static tree (mars.decoding.static_tree).

Why: on a GPU a small model's pass costs a couple of milliseconds at any width, and the host loop
(mars.decoding.decoder) spends more than that between passes (windows, masks, acceptance, records) and waits
for the device every pass. Here the whole step reads and writes device tensors only (`StepState`), so the
runtime can capture it as one CUDA graph per (mode, batch bucket, width) and replay k of them before the
host reads the new tokens and the done flags in one copy (mars.decoding.device_loop).

Layout of a row (unlike the host loop's shared columns): row r's token at position p sits at column p of
its own KV row; columns [0, L_r) are committed (computed from real inputs), the row's tokens are seq[r, :F_r].
A window has fixed slots (`Layout`), the same for every row and every pass of a mode:
    [R pending | X extras | G groups of M masks]
  pending  the row's uncommitted tokens seq[L_r:F_r] (at most R; the rest of the slots are padding)
  extras   verified: the previous pass's drafts as real tokens (a chain, or the static tree's nodes)
  groups   masks proposing the next drafts (mars: one group after the real tokens)
Slots that are not real (masks, padding, off-chain tree nodes, every slot of a finished row) write their KV
to scratch columns past the capacity, one per slot, so a pass never overwrites a committed column or
another slot's key. Who sees whom is the host loop's `masks.window_mask` for the fixed slots, cut down to
the slots each row really uses.

The rules are the host modes' (mars.decoding.modes), written for all rows at once:
  ar        the AR token.
  mars      the AR token and the masks' tokens, accepted left to right while confidence >= tau
            (acceptance.accept_lengths' rule, with the repeat guard).
  verified  the drafts the AR logits confirm plus the AR token after them; the next drafts come from the
            mask group that saw exactly the accepted drafts, kept while their confidence >= tau.
  tree      the accepted path of the static tree (the walk of mars.decoding.tree: follow the child equal to
            the parent's AR token), then the AR token; next candidates from the group on the deepest chain
            node of the path, its masks shifted by how far the path went past it.
Then, for every mode: the first EOS ends the accepted run, max_new_tokens caps it, a finished row stops
writing; commit: L = min(the end of the real inputs, F - 1), as BlockCache.commit keeps the last token
uncommitted to feed it next pass.
Not here (refused by DecodeConfig): sampling, lookup drafts, jacobi, the inspector's top-k; stop strings are
applied by the host loop at each read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from mars.decoding.masks import window_mask

MODES = ("ar", "mars", "chain", "tree")
# what each decoder mode needs from this module: the fixed layout's kind
NO_REASON, EOS, LENGTH = 0, 1, 2  # a row's finish reason, as the step records it


@dataclass(frozen=True)
class Layout:
    """The fixed slots of one mode's window (the same for every row and every pass at a given R)."""

    kind: str  # one of MODES
    R: int  # pending slots (the prefill pass: the longest prompt; then at most B)
    X: int = 0  # extras: verified drafts (chain) or tree nodes
    G: int = 0  # mask groups
    M: int = 0  # masks per group
    parents: tuple[int, ...] | None = None  # tree: each node's parent (-1: the root); chain: None
    ranks: tuple[int, ...] | None = None  # tree: each node's candidate rank at its depth
    last_group: bool = False  # chain, verify_groups "last": one group, after however many drafts were sent

    @property
    def W(self) -> int:
        return self.R + self.X + self.G * self.M

    @property
    def depths(self) -> list[int]:
        """Each extra's depth (1: right after the last real token)."""
        if self.parents is None:
            return list(range(1, self.X + 1))
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    @property
    def chain_len(self) -> int:
        """Extras 0..chain_len-1 are the top-1 chain (their KV goes to their own columns; a tree's others'
        to scratch)."""
        if self.parents is None:
            return self.X
        n = 0
        while n < self.X and self.parents[n] == n - 1:
            n += 1
        return n

    def structure(self) -> torch.Tensor:
        """(W, W) bool: who may see whom when every slot is used (masks.window_mask of the fixed slots)."""
        if self.last_group:
            groups = [(self.X, self.M)] if self.G else []
        else:
            groups = [(g, self.M) for g in range(self.G)]  # group g after extra g-1 (a tree: chain node g-1)
        return window_mask(0, self.R, self.X, groups, None if self.parents is None else list(self.parents))


@dataclass
class Consts:
    """What a run fixes for its steps, as device tensors and numbers (never read back)."""

    eos: torch.Tensor  # (n_eos,) long
    max_new: int
    mask_id: int
    measure: str  # the confidence measure (acceptance.CONFIDENCE_MEASURES)
    temps: torch.Tensor | None  # (M,) float32: mask j's calibration temperature (None: raw confidences)
    repeat_tau: float | None
    max_per_pass: int | None
    capacity: int  # KV columns for real tokens; scratch columns follow
    columns: int  # all KV columns (capacity + scratch: at least the widest layout's W)


@dataclass
class StepState:
    """A run's state on the device, updated in place by every step (a graph replays over these addresses)."""

    seq: torch.Tensor  # (b, S) long: each row's tokens at their positions
    F: torch.Tensor  # (b,) long: tokens so far (the frontier)
    L: torch.Tensor  # (b,) long: committed KV columns
    n_prompt: torch.Tensor  # (b,) long
    done: torch.Tensor  # (b,) bool: finished (or a padding row): writes nothing more
    drafts: torch.Tensor  # (b, Dm) long: chain drafts, or a tree's candidates' depth-major (D, K) flattened
    draft_p: torch.Tensor  # (b, Dm) float32: their confidences / probabilities
    n_drafts: torch.Tensor  # (b,) long: drafts held (a tree: depths of candidates held)
    tau: torch.Tensor  # () float32: the live tau, written by the host between reads
    # the output ring, one slot per step between reads; `t` is the next slot
    out_tok: torch.Tensor  # (k, b, O) long: accepted tokens, then rejected drafts
    out_conf: torch.Tensor  # (k, b, O) float32
    out_n: torch.Tensor  # (k, b) long: accepted
    out_rej: torch.Tensor  # (k, b) long: rejected after them
    out_sent: torch.Tensor  # (k, b) long: drafts fed as real tokens
    out_cache: torch.Tensor  # (k, b) long: committed columns before the pass
    out_reason: torch.Tensor  # (k, b) long: NO_REASON, EOS, LENGTH
    out_guard: torch.Tensor  # (k, b) bool: mars, the repeat guard cut the chain
    out_live: torch.Tensor  # (k, b) bool: the row proposed in this step (it was not done before it)
    t: torch.Tensor  # () long


def new_state(prompts: list[list[int]], batch: int, width_out: int, n_drafts: int, k: int, S: int, tau: float,
              device) -> StepState:
    """The state of a run of `prompts` in `batch` slots (the rest are padding rows, done from the start)."""
    b = batch
    seq = torch.zeros((b, S), dtype=torch.long)
    for i, p in enumerate(prompts):
        seq[i, :len(p)] = torch.tensor(p, dtype=torch.long)
    lens = torch.tensor([len(p) for p in prompts] + [1] * (b - len(prompts)), dtype=torch.long)
    done = torch.arange(b) >= len(prompts)
    z = dict(device=device)
    return StepState(
        seq=seq.to(**z), F=lens.clone().to(**z), L=torch.zeros(b, dtype=torch.long, **z), n_prompt=lens.clone().to(**z),
        done=done.to(**z), drafts=torch.zeros((b, n_drafts), dtype=torch.long, **z),
        draft_p=torch.zeros((b, n_drafts), dtype=torch.float32, **z), n_drafts=torch.zeros(b, dtype=torch.long, **z),
        tau=torch.tensor(tau, dtype=torch.float32, **z),
        out_tok=torch.zeros((k, b, width_out), dtype=torch.long, **z),
        out_conf=torch.zeros((k, b, width_out), dtype=torch.float32, **z),
        out_n=torch.zeros((k, b), dtype=torch.long, **z), out_rej=torch.zeros((k, b), dtype=torch.long, **z),
        out_sent=torch.zeros((k, b), dtype=torch.long, **z), out_cache=torch.zeros((k, b), dtype=torch.long, **z),
        out_reason=torch.zeros((k, b), dtype=torch.long, **z), out_guard=torch.zeros((k, b), dtype=torch.bool, **z),
        out_live=torch.zeros((k, b), dtype=torch.bool, **z), t=torch.zeros((), dtype=torch.long, **z),
    )


class Step:
    """One mode's step at one layout: `__call__()` runs a pass on `forward` and updates `st` in place.

    The fixed parts (the slots' structure, positions' offsets, the tree's ancestors) are built once here, on
    the device; a call launches tensor ops only, so it can be captured and replayed."""

    def __init__(self, lay: Layout, st: StepState, c: Consts, forward, tree_k: int = 0):
        self.lay, self.st, self.c, self.forward = lay, st, c, forward
        d = st.F.device
        self.device = d
        self.tree_k = tree_k  # candidates kept per depth (a tree)
        struct, anc = _fixed(lay)
        self.struct = struct.to(d)  # (W, W)
        W = lay.W
        self.eye = torch.eye(W, dtype=torch.bool, device=d)
        self.slot = torch.arange(W, device=d)
        self.depth = torch.tensor(lay.depths, dtype=torch.long, device=d)  # (X,)
        self.chain = torch.arange(lay.X, device=d) < lay.chain_len  # (X,): extras whose KV is kept when verified
        if lay.parents is not None:
            self.anc = anc.to(d)  # (X, X): [i, j] j is i or an ancestor of i
            self.parent_slot = torch.tensor([p + 1 for p in lay.parents], dtype=torch.long, device=d)  # in main
            self.rank = torch.tensor(lay.ranks, dtype=torch.long, device=d)
        self.cols_n = torch.arange(c.columns, device=d)

    # -- 1. the window

    def _window(self):
        lay, st, c = self.lay, self.st, self.c
        b = st.F.shape[0]
        live = ~st.done
        j = torch.arange(lay.R, device=self.device)
        pcol = st.L[:, None] + j  # (b, R): pending positions
        pvalid = (pcol < st.F[:, None]) & live[:, None]
        pids = torch.where(pvalid, st.seq.gather(1, pcol.clamp(max=st.seq.shape[1] - 1)), 0)
        F = st.F[:, None]
        xids, xpos, xvalid, xreal = self._extras(live)
        if lay.G * lay.M:
            o = torch.arange(lay.M, device=self.device)
            if lay.last_group:
                gpos = F + st.n_drafts[:, None] + o  # after however many drafts were sent
            else:  # group g after extra g-1: mask o at F + g + o
                gpos = F + (torch.arange(lay.G, device=self.device)[:, None] + o[None, :]).reshape(1, -1)
            gids = torch.full_like(gpos, c.mask_id)
            gvalid = live[:, None].expand_as(gpos)
        else:
            gpos = gids = torch.zeros((b, 0), dtype=torch.long, device=self.device)
            gvalid = torch.zeros((b, 0), dtype=torch.bool, device=self.device)
        ids = torch.cat([pids, xids, gids], 1)  # (b, W)
        valid = torch.cat([pvalid, xvalid, gvalid], 1)
        pos = torch.where(valid, torch.cat([pcol, xpos, gpos], 1), 0)
        real = torch.cat([pvalid, xreal, torch.zeros_like(gvalid)], 1)  # KV at its own column
        cols = torch.where(real, pos, c.capacity + self.slot)  # (b, W): distinct within a row
        local = (self.struct[None] & valid[:, None, :]) | self.eye  # (b, W, W)
        allowed = (self.cols_n[None, :] < st.L[:, None])[:, None, :].expand(b, lay.W, -1).clone()
        allowed.scatter_(2, cols[:, None, :].expand(b, lay.W, lay.W), local)  # (b, W, N)
        return ids, pos, cols, allowed, pvalid, xids, xvalid

    def _extras(self, live):
        lay, st = self.lay, self.st
        b = st.F.shape[0]
        if lay.X == 0:
            e = torch.zeros((b, 0), dtype=torch.long, device=self.device)
            return e, e, e.bool(), e.bool()
        F = st.F[:, None]
        xpos = F - 1 + self.depth[None]  # (b, X)
        if lay.parents is None:  # a chain: the drafts held
            xids = st.drafts[:, :lay.X]
            xvalid = (torch.arange(lay.X, device=self.device)[None] < st.n_drafts[:, None]) & live[:, None]
        else:  # the static tree: node i = the candidate of rank rank[i] at its depth
            K = self.tree_k
            idx = ((self.depth - 1) * K + self.rank)[None].expand(b, -1)
            xids = st.drafts.gather(1, idx)
            p = st.draft_p.gather(1, idx)
            ok = (self.depth[None] <= st.n_drafts[:, None]) & (p >= st.tau) & (st.tau < 1.0)  # (b, X)
            # a node stands only with all its ancestors: the tree stays closed under ancestors
            xvalid = (ok[:, None, :] | ~self.anc[None]).all(-1) & live[:, None]
        xreal = xvalid & self.chain[None]
        return xids, xpos, xvalid, xreal

    # -- the step

    @torch.inference_mode()
    def __call__(self):
        lay, st, c = self.lay, self.st, self.c
        ids, pos, cols, allowed, pvalid, xids, xvalid = self._window()
        logits = self.forward(ids, pos, allowed, cols, lay.G * lay.M > 0)  # (b, W, V) float32
        live = ~st.done
        last = (st.F - 1 - st.L).clamp(min=0)  # (b,): the slot of the last real token
        # each mode: the record's proposals (accepted first), their confidences, how many it accepts, how many
        # of its extras were verified (their KV kept), how many drafts it rejected, the repeat guard, and the
        # next pass's drafts (tokens, confidences, how many) or None
        if lay.kind == "ar":
            props, conf = _score(_at(logits, last[:, None]), c.measure)
            zero = torch.zeros_like(st.F)
            out = props, conf, zero + 1, zero, zero, None, None
        elif lay.kind == "mars":
            out = self._mars(logits, last)
        elif lay.kind == "chain":
            out = self._chain(logits, last, xids, xvalid)
        else:
            out = self._tree(logits, last, xids, xvalid)
        self._finish(*out, live, xvalid.sum(1))

    # -- 2. score and 3. accept, per mode

    def _mars(self, logits, last):
        st, c, lay = self.st, self.c, self.lay
        rows = torch.cat([last[:, None], lay.R + torch.arange(lay.M, device=self.device)[None].expand(len(last), -1)], 1)
        x = _at(logits, rows)  # (b, B, V): the AR token, then the masks in order
        props, conf = _score(x, c.measure, _calibrated(x, c.temps, ar_rows=1))
        ok = conf[:, 1:] >= st.tau
        n_plain = 1 + torch.cumprod(ok.long(), 1).sum(1)
        if c.repeat_tau is not None:
            reps = _repeat_flags(st.seq, st.F, props)
            clears = conf[:, 1:] >= c.repeat_tau if c.repeat_tau < 1.0 else torch.zeros_like(ok)
            ok = ok & (~reps[:, 1:] | clears)
        n = 1 + torch.cumprod(ok.long(), 1).sum(1)
        n = torch.where(st.tau >= 1.0, 1, n)  # tau 1 is AR exactly
        n_plain = torch.where(st.tau >= 1.0, 1, n_plain)
        if c.max_per_pass is not None:
            n, n_plain = n.clamp(max=c.max_per_pass), n_plain.clamp(max=c.max_per_pass)
        zero = torch.zeros_like(n)
        return props, conf, n, zero, props.shape[1] - n, n < n_plain, None

    def _chain(self, logits, last, xids, xvalid):
        st, c, lay = self.st, self.c, self.lay
        b = len(last)
        main = torch.cat([last[:, None], lay.R + torch.arange(lay.X, device=self.device)[None].expand(b, -1)], 1)
        ar, ar_conf = _score(_at(logits, main), "prob")  # (b, 1 + X): the model's own choice after each input
        hit = (xids == ar[:, :lay.X]) & xvalid
        m = torch.cumprod(hit.long(), 1).sum(1)  # (b,) verified drafts
        nd = st.n_drafts
        # out: accepted ar[:m+1], then the rejected drafts[m:nd] with their own confidences
        o = torch.arange(lay.X + 1, device=self.device)[None]
        d_shift = torch.cat([st.drafts[:, :lay.X], torch.zeros_like(st.drafts[:, :1])], 1)  # (b, X + 1)
        dp_shift = torch.cat([st.draft_p[:, :lay.X], torch.zeros_like(st.draft_p[:, :1])], 1)
        rej_at = (o - 1).clamp(min=0).expand(b, -1)  # out slot m+1+i holds draft m+i (gather takes its index's shape)
        props = torch.where(o <= m[:, None], ar, d_shift.gather(1, rej_at))
        conf = torch.where(o <= m[:, None], ar_conf, dp_shift.gather(1, rej_at))
        # 4. the next drafts: the group that saw exactly the accepted drafts
        if lay.G * lay.M:
            g = m if not lay.last_group else torch.zeros_like(m)
            has = torch.ones_like(m, dtype=torch.bool) if not lay.last_group else (m == nd)
            rows = lay.R + lay.X + g[:, None] * lay.M + torch.arange(lay.M, device=self.device)[None]
            x = _at(logits, rows)  # (b, M, V)
            tok, dconf = _score(x, c.measure, _calibrated(x, c.temps, ar_rows=0))
            keep = torch.cumprod((dconf >= st.tau).long(), 1).sum(1)
            keep = torch.where(st.tau >= 1.0, 0, keep)
            if c.max_per_pass is not None:
                keep = keep.clamp(max=c.max_per_pass - 1)
            nxt = (tok, dconf, torch.where(has, keep, 0))
        else:
            nxt = None
        return props, conf, m + 1, m, nd - m, None, nxt

    def _tree(self, logits, last, xids, xvalid):
        st, c, lay = self.st, self.c, self.lay
        b = len(last)
        main = torch.cat([last[:, None], lay.R + torch.arange(lay.X, device=self.device)[None].expand(b, -1)], 1)
        ar, ar_conf = _score(_at(logits, main), "prob")  # (b, 1 + X): after the root, after each node
        # the walk: a node is on the path when it and every ancestor equals its parent's AR token
        hit = xvalid & (xids == ar.gather(1, self.parent_slot[None].expand(b, -1)))
        on = (hit[:, None, :] | ~self.anc[None]).all(-1)  # (b, X); one node per depth at most (distinct ranks)
        de = (on.long() * self.depth[None]).amax(1) if lay.X else torch.zeros_like(last)  # (b,) path length
        # the path's slots in main, by depth: the root, then the node on the path at depth 1, 2, ...
        D = max(lay.depths, default=0)
        by_depth = on[:, None, :] & (self.depth[None, None, :] == torch.arange(1, D + 1, device=self.device)[None, :, None])
        node_at = (by_depth.long() * (torch.arange(lay.X, device=self.device) + 1)[None, None]).sum(2)  # (b, D)
        path_slot = torch.cat([torch.zeros_like(last)[:, None], node_at], 1)  # (b, D + 1), 0 past the path
        props, conf = ar.gather(1, path_slot), ar_conf.gather(1, path_slot)  # accepted: props[:de + 1]
        c_on = torch.cumprod(on[:, :lay.chain_len].long(), 1).sum(1)  # path nodes on the chain (KV kept)
        if lay.G * lay.M:  # the next candidates: the group on chain node c_on - 1, shifted by de - c_on
            rows = lay.R + lay.X + c_on[:, None] * lay.M + torch.arange(lay.M, device=self.device)[None]
            x = _at(logits, rows)  # (b, M, V)
            p = torch.softmax(_calibrated(x, c.temps, ar_rows=0).float(), -1)
            top = p.topk(self.tree_k, dim=-1)  # (b, M, K)
            shift = (de - c_on)[:, None] + torch.arange(lay.M, device=self.device)[None]  # (b, M)
            at = shift.clamp(max=lay.M - 1)[:, :, None].expand(-1, -1, self.tree_k)
            nxt = (top.indices.gather(1, at), top.values.gather(1, at), lay.M - (de - c_on))
        else:
            nxt = None
        return props, conf, de + 1, c_on, torch.zeros_like(de), None, nxt

    # -- 3. limits and 4. commit, every mode

    def _finish(self, props, conf, n, n_real, n_rej, guard, nxt, live, sent):
        st, c, lay = self.st, self.c, self.lay
        b, O = props.shape
        o = torch.arange(O, device=self.device)[None]
        n_before, n_out = n, n + n_rej  # the mode's accepted run; the record's proposals (accepted, then rejected)
        n_gen = st.F - st.n_prompt
        # EOS tests as a broadcast compare: isin may sort, and a step must stay one plain graph
        is_eos = (props[:, :, None] == c.eos).any(-1)  # (b, O)
        eos = is_eos & (o < n[:, None])
        first = torch.where(eos, o, O).amin(1)  # (b,): the first EOS among the accepted (O: none)
        n = torch.minimum(n, first + 1)
        n = torch.minimum(n, c.max_new - n_gen)
        ends_eos = is_eos.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]
        reason = torch.where(ends_eos, EOS, torch.where(n_gen + n >= c.max_new, LENGTH, NO_REASON))
        n = torch.where(live, n, 0)
        reason = torch.where(live, reason, NO_REASON)
        guard = torch.zeros_like(live) if guard is None else guard & (n == n_before)  # not when a limit cut first
        t = st.t.view(1)
        st.out_tok.index_copy_(0, t, props[None])
        st.out_conf.index_copy_(0, t, conf.float()[None])
        st.out_n.index_copy_(0, t, n[None])
        st.out_rej.index_copy_(0, t, torch.where(live, n_out - n, 0)[None])
        st.out_sent.index_copy_(0, t, torch.where(live, sent, 0)[None])
        st.out_cache.index_copy_(0, t, st.L[None])
        st.out_reason.index_copy_(0, t, reason[None])
        st.out_guard.index_copy_(0, t, guard[None])
        st.out_live.index_copy_(0, t, live[None])
        # the row takes its tokens; KV committed up to the end of its real inputs, the last token left to feed
        idx = st.F[:, None] + o  # (b, O), inside seq (S leaves room)
        old = st.seq.gather(1, idx)
        st.seq.scatter_(1, idx, torch.where(o < n[:, None], props, old))
        F_new = st.F + n
        L_new = torch.minimum(st.F + n_real, F_new - 1)
        st.L.copy_(torch.where(live, L_new, st.L))
        st.F.copy_(F_new)
        st.done.copy_(st.done | (reason != NO_REASON))
        if nxt is not None:
            tok, p, keep = nxt
            Dm = st.drafts.shape[1]
            st.drafts.copy_(tok.reshape(b, -1)[:, :Dm])
            st.draft_p.copy_(p.reshape(b, -1)[:, :Dm].float())
            st.n_drafts.copy_(keep)
        st.t.add_(1)


@lru_cache(maxsize=64)
def _fixed(lay: Layout) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layout's host-side structure (its window mask, a tree's ancestors), built once per layout: like its
    graphs, a layout's fixed parts are made once, not per run."""
    anc = window_mask(0, 0, lay.X, [], list(lay.parents)) if lay.parents is not None else None
    return lay.structure(), anc


def _at(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """logits[r, rows[r]]: (b, W, V), (b, n) -> (b, n, V), one gather for the whole batch."""
    return logits.gather(1, rows[:, :, None].expand(-1, -1, logits.shape[-1]))


def _calibrated(x: torch.Tensor, temps: torch.Tensor | None, ar_rows: int) -> torch.Tensor:
    """acceptance.calibrate_logits for (b, n, V): rows past the first `ar_rows` are masks 1, 2, ..."""
    if temps is None:
        return x
    n = x.shape[1]
    masks = n - ar_rows
    t = torch.cat([torch.ones(ar_rows, device=x.device), temps[:masks]])
    if len(t) < n:
        t = torch.cat([t, torch.ones(n - len(t), device=x.device)])
    return x.float() / t[None, :, None]


def _score(x: torch.Tensor, measure: str, conf_logits: torch.Tensor | None = None):
    """Greedy token and its confidence for every row at once (acceptance.choose_and_score's greedy rule)."""
    tok = x.argmax(-1)
    logp = torch.log_softmax((x if conf_logits is None else conf_logits).float(), -1)
    probs = logp.exp()
    if measure == "prob":
        conf = probs.gather(-1, tok[..., None])[..., 0]
    elif measure == "entropy":
        conf = torch.exp((probs * logp).nan_to_num().sum(-1))
    else:
        top2 = probs.topk(2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    return tok, conf


def _repeat_flags(seq: torch.Tensor, F: torch.Tensor, props: torch.Tensor, max_ngram: int = 2) -> torch.Tensor:
    """acceptance.repeat_flags for every row: (b, n) bool, proposal j repeats the k tokens before it (k <= 2),
    the row's last 2k - 1 tokens before the pass included. Missing context (a prompt shorter than that) is
    a distinct negative id per place, which equals no token."""
    b = seq.shape[0]
    T = 2 * max_ngram - 1
    at = F[:, None] - T + torch.arange(T, device=seq.device)[None]  # (b, T)
    tail = torch.where(at >= 0, seq.gather(1, at.clamp(min=0)), -1 - torch.arange(T, device=seq.device)[None])
    s = torch.cat([tail, props], 1)  # (b, T + n)
    flags = torch.zeros_like(props, dtype=torch.bool)
    for k in range(1, max_ngram + 1):
        same = torch.ones_like(flags)
        for i in range(k):
            # s[j - i] == s[j - k - i] for the proposal at j = T + column
            a = s[:, T - i: T - i + props.shape[1]]
            c = s[:, T - k - i: T - k - i + props.shape[1]]
            same = same & (a == c)
        flags = flags | same
    return flags
