"""The decoder's stages over rows that come and go: every row that is ready runs in ONE forward pass
(continuous batching), each with its own settings, mode, live tau, generator, stop strings and cache row.

A `Row` owns everything that is its own: its DecodeConfig (mode, B, tau, drafts or tree, stop strings, limits),
its mode object (a tree's per-row state), its DecodeControl (live tau, Stop), its sampling generator (seeded
from its own seed, so a row samples the same alone or beside others), its tokens and text, and its part of
the shared KV cache (`n_cached`). The `Scheduler` holds the rows and one backend; `step()` is one pass:

  0. admit   : rows added since the last pass join (the backend grows by their cache rows); cancelled rows go
  1. propose : each row's window (`_window`): its uncommitted tokens, then what its mode plans (mars: B-1
               masks; verified: drafts and mask groups; a tree; jacobi guesses; ar: nothing); a row still in
               its prefill feeds a chunk of its prompt and plans nothing (PREFILL_CHUNK); windows of any
               width right-aligned in one (b, W) input, one forward
  2. score   : each row's mode picks tokens and measures their confidence (mars.decoding.modes)
  3. accept  : each row's mode accepts its own; then EOS, stop strings, limits (`_accept`)
  4. commit  : each row keeps the KV it computed from real inputs (mars.decoding.cache.BlockCache.commit);
               finished rows leave; the cache is packed when holes dominate (`BlockCache.compact`)

A row's next pass depends only on its own prefix, so whoever shares its passes, and whenever it joined, a row
gets exactly the passes it would get alone: its tokens are its solo tokens (tests/test_scheduler.py). The fixed
batch (`mars.decoding.decoder.decode_steps`) is one caller: all rows join at once and, with `cache_block`, idle
at cache-block ends as the paper's block-level cache does (Fig. 4). The app's server (mars.app.batching) is the
other: rows join whenever a visitor asks, and no row ever waits for another.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from mars.decoding.acceptance import top_probs
from mars.decoding.cache import BlockCache
from mars.decoding.masks import tree_depths, window_mask
from mars.decoding.modes import Outcome, RowPlan, make_mode
from mars.decoding.records import PassRecord
from mars.decoding.rows import RowText, take

# prompt tokens a pass at least, all joining rows together, while more rows decode beside them: a long prompt then
# adds about one decoding pass's time to each pass it is fed in, not a stall (Scheduler.step)
PREFILL_CHUNK = 32
MAX_SPARE_SLOTS = 16  # free cache rows added at most when rows join a full cache (each is memory, no compute)


def make_runner(model, cfg, batch: int, capacity: int):
    """The backend `cfg.backend` names (mars.runtime.backends), for `batch` rows sized for `capacity` columns:
    the scheduler's default where the caller hands it no `backend`."""
    from mars.runtime.backends import make_backend

    return make_backend(model, cfg.backend, batch, capacity, cfg.use_cache)


def context_needed(prompt_tokens: int, cfg) -> int:
    """Positions a run may use: the prompt, the answer, and a last pass's masks reaching past the answer."""
    return prompt_tokens + cfg.max_new_tokens + 2 * cfg.block_size


def check_context(model, prompt_tokens: int, cfg) -> None:
    """Refuse a run that would not fit the model's context, before any forward pass."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit and context_needed(prompt_tokens, cfg) > limit:
        raise ValueError(
            f"the prompt ({prompt_tokens} tokens) plus max new tokens ({cfg.max_new_tokens}) does not fit this "
            f"model's context of {limit} tokens: shorten the prompt or lower max new tokens"
        )


def check_rows(lm, prompts: list[list[int]], cfg) -> None:
    """What rows of `cfg` need before they may run: a mask token for the modes that draft from masks, a token in
    every prompt, room in the model's context for the longest. The fixed batch (decoder.decode_steps) and the
    app's admission (mars.app.batching) both ask here."""
    needs_masks = cfg.mode == "mars" or (cfg.mode == "verified" and cfg.drafts != "lookup")
    if needs_masks and lm.mask_token_id is None:
        raise ValueError(f"this model has no mask token: use mode 'ar', or give a mask token to use {cfg.mode}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    check_context(lm.model, max(len(p) for p in prompts), cfg)


class Row(RowText):
    """One request: its settings, mode, control and generator, its tokens and text (RowText), and where it stands
    in the shared cache."""

    def __init__(self, index: int, prompt: list[int], cfg, control, mode, pad: int = 0, tag=None):
        super().__init__(index, prompt)
        self.cfg = cfg
        self.control = control
        self.mode = mode
        # one generator per row, seeded by the row's own seed: its samples do not depend on who else is in the pass
        self.gen = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None
        self.pad = pad  # the fixed batch's left padding to its longest prompt: the frontier is a logical column
        self.n_cached = 0  # leading tokens whose KV the cache holds (never fed again)
        self.drafts: list[int] = []  # verified / jacobi: tokens proposed for the columns after the frontier
        self.draft_conf: list[float] = []
        self.passes = 0  # passes this row has been in since it joined: its records' pass_index
        self.passes_planned = 0  # passes in which its mode planned (the first one ends its prefill)
        self.tag = tag  # the caller's own handle (the app's visitor run)
        # (inputs, tokens) the other rows brought to this row's last pass: a tree's cut weighs its nodes against the
        # whole shared pass (tree.cut_rate); None alone
        self.shared: tuple[int, float] | None = None
        self.last_width = 0  # inputs and tokens of its last pass that planned
        self.last_tokens = 0
        self.departed = False  # set by the caller when nobody reads the row any more: it leaves before the next pass

    @property
    def gone(self) -> bool:
        return self.departed or self.control.cancelled

    @property
    def frontier(self) -> int:
        return self.pad + len(self.tokens)

    @property
    def tau(self) -> float:
        """The tau of the row's next pass: its control's live value, else its config's."""
        return self.cfg.tau if self.control.tau is None else self.control.tau

    @property
    def decoding(self) -> bool:
        """Past its prefill: its mode has planned a pass."""
        return self.passes_planned > 0


@dataclass
class PassStats:
    """What one pass of the scheduler did, as data (the app's live batch line, the benchmark)."""

    rows: int  # rows in the forward (idle and prefilling ones included)
    inputs: int  # inputs computed: every row's window, padding excluded
    widths: list[int]  # each row's window width, in the pass's row order
    seconds: float
    tokens: int  # accepted by all rows together
    decode_inputs: int = 0  # the inputs of the rows that planned (prefills and idle rows left out)


class Scheduler:
    """Rows in one KV cache, stepped one forward pass at a time. `add` a row at any time (it joins at the next
    pass), `step()` runs one pass for every live row and returns its records; finished and cancelled rows
    leave on their own. All rows share one backend (one model, one cache): a row whose config names another
    backend or cache setting belongs in another scheduler (`accepts`)."""

    def __init__(self, lm, backend_name: str, use_cache: bool = True, *, backend=None, capacity: int = 256,
                 cache_block: int | None = None, prompt_len: int = 0,
                 prefill_chunk: int | None = PREFILL_CHUNK):
        # backend: the runner factory (model, cfg, batch, capacity) -> runner; default make_runner. cache_block:
        # rows idle at cache-block ends from prompt_len on (the fixed batch); None: no row waits for another.
        # prefill_chunk: a joining prompt's tokens per pass beside decoding rows (None: all at once)
        self.lm = lm
        self.backend_name = backend_name
        self.use_cache = use_cache
        self.tok = lm.tokenizer
        self.eos = set(lm.eos_token_ids)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.prefill_chunk = prefill_chunk
        self._factory = backend or make_runner
        self._capacity = capacity
        self.runner = None  # made on the first admission, sized by the rows that join then
        self.cache: BlockCache | None = None
        self._cache_block = cache_block
        self._prompt_len = prompt_len
        self.rows: list[Row] = []  # live rows, in the cache's row order
        self.slots: list[Row | None] = []  # the cache's rows: a live row, or None where one left
        self.pending: list[Row] = []  # added, joining at the next pass
        self._next_index = 0
        self.last: PassStats | None = None

    @property
    def scoring(self):
        return getattr(self.runner, "scoring", None)

    def accepts(self, cfg) -> bool:
        return cfg.backend == self.backend_name and cfg.use_cache == self.use_cache

    def add(self, prompt: list[int], cfg, control, *, mode=None, pad: int = 0, tag=None, index: int | None = None) -> Row:
        """A new row for `prompt` (token ids) with its own config and control; it joins at the next pass."""
        if not self.accepts(cfg):
            raise ValueError(f"a row of backend {cfg.backend!r} cannot join a scheduler of {self.backend_name!r}")
        if cfg.backend == "static-device":  # whole steps on the device, one run at a time (mars.decoding.device_loop)
            raise ValueError("backend 'static-device' decodes one run at a time on the device: it does not share passes")
        if not prompt:
            raise ValueError("every prompt needs at least one token")
        index = self._next_index if index is None else index
        self._next_index = max(self._next_index, index + 1)
        row = Row(index, list(prompt), cfg, control, mode, pad, tag)
        self.pending.append(row)
        return row

    @property
    def idle(self) -> bool:
        return not self.rows and not self.pending

    def _admit(self):
        joining, self.pending = self.pending, []
        if not joining:
            return
        need = max(len(r.tokens) + r.cfg.max_new_tokens + r.cfg.block_size ** 2 for r in joining)
        if self.runner is None:  # sized for the first rows; later ones make it grow
            self.runner = self._factory(self.lm.model, joining[0].cfg, len(joining), max(need, self._capacity))
            self.cache = BlockCache(self.runner, self._prompt_len, len(joining), self._cache_block, self.use_cache)
            self.slots = list(joining)
        else:  # a free slot first (a finished row's: its columns are holes for it), else a new cache row
            free = [i for i, r in enumerate(self.slots) if r is None]
            for i, r in zip(free, joining):
                self.slots[i] = r
            extra = joining[len(free):]
            if extra:  # room for as many again (free slots): a room filling up row by row copies its cache rarely
                spare = max(0, min(len(self.slots), MAX_SPARE_SLOTS) - len(extra))
                self.cache.add_rows(len(extra) + spare)
                self.slots += extra + [None] * spare
        for r in joining:
            if r.mode is None:
                r.mode = make_mode(r.cfg, self.lm, self.scoring)
            elif getattr(r.mode, "scoring", None) is None:
                r.mode.scoring = self.scoring
        self.rows = [r for r in self.slots if r is not None]

    def _leave(self, slots: list[int]):
        """These slots' rows leave. Their slots stay (a window of nothing, which no backend computes, and columns
        that are holes for the row that takes the slot next), so a leaving row copies no cache; once free slots
        are twice the rows (and 8 or more), the cache keeps only the rows' (one copy, rarely)."""
        for i in slots:
            self.slots[i] = None
            self.cache.key_ok[i] = False
        self.rows = [r for r in self.slots if r is not None]
        if not self.rows:  # nobody left: the next rows start from a new cache, sized for them
            self.runner = self.cache = None
            self.slots = []
            return
        free = len(self.slots) - len(self.rows)
        if free >= max(8, 2 * len(self.rows)):  # well past what a room's growth leaves free (_admit): no thrash
            self.cache.select([i for i, r in enumerate(self.slots) if r is not None])
            self.slots = list(self.rows)

    def cancel_departed(self) -> list[Row]:
        """Rows cancelled (their control) or departed (their reader) leave now, finish reason "cancelled"; returned."""
        gone = [r for r in self.pending if r.gone]
        self.pending = [r for r in self.pending if not r.gone]
        out = [i for i, r in enumerate(self.slots) if r is not None and r.gone]
        gone += [self.slots[i] for i in out]
        if out:
            self._leave(out)
        for r in gone:
            r.finish_reason = "cancelled"
        return gone

    def step(self, hold: set[int] | frozenset = frozenset()) -> list[PassRecord]:
        """One forward pass for every live row; the records of the rows that proposed in it. Rows whose index is
        in `hold` idle this pass (their reader has not taken their last record yet: mars.app.batching); idling
        never changes a row's tokens."""
        self.cancel_departed()
        self._admit()
        if not self.rows:
            self.last = None
            return []
        t0 = time.perf_counter()
        slots, cache, rows = self.slots, self.cache, self.rows  # slots: the cache's rows, None where free
        mask_id = self.lm.mask_token_id
        # rows at the cache-block end idle (the fixed batch only): they feed their uncommitted tokens but the
        # last, and accept nothing
        block_end = cache.next_block([r.frontier for r in rows])
        last = self.last
        for r in rows:  # the others' share of the last pass (an estimate of this one's: rows come and go slowly)
            r.shared = ((last.decode_inputs - r.last_width, float(last.tokens - r.last_tokens))
                        if last is not None and len(rows) > 1 else None)
        taus = [r.tau if r is not None else None for r in slots]
        plans: list[RowPlan | None] = []
        limits: list[int | None] = []
        # prefills beside decoding rows share a budget of prompt tokens a pass, first come first served: at least
        # PREFILL_CHUNK, or as many as the decoding rows' inputs (a pass at most doubles). With no row decoding, or
        # as many rows joining as decoding (a room filling up: their first groups matter more than a pass's time),
        # every prompt goes whole
        decoding = sum(r.decoding for r in rows)
        budget = None
        if self.prefill_chunk is not None and decoding and len(rows) - decoding < decoding:
            budget = max(self.prefill_chunk, last.decode_inputs if last is not None else 0)
        for r, tau in zip(slots, taus):
            if r is None:
                plans.append(None)
                limits.append(0)
                continue
            waiting = len(r.tokens) - 1 - r.n_cached  # prompt tokens still to feed before the last one
            if budget is not None and not r.decoding:
                if waiting > budget:  # a chunk of its prompt this pass (maybe none), its first plan later
                    plans.append(None)
                    limits.append(budget)
                    budget = 0
                    continue
                budget -= waiting
            limits.append(None)
            if (block_end is not None and r.frontier >= block_end) or r.index in hold:
                plans.append(None)
            else:
                plans.append(r.mode.plan(r, r.cfg, tau))

        # 1. propose: one window per slot (a free slot's is empty), right-aligned in the pass's input, one forward
        windows = [_window(r, p, mask_id, lim) if r is not None else _NOTHING for r, p, lim in zip(slots, plans, limits)]
        ids, pos, local, starts = _stack_windows(windows, self.pad_id)
        # the logits read; a pass where no row plans (its readers are behind, a prompt goes in chunks) reads one
        # all the same, the last column, which every backend can give (it commits the prompt's chunk)
        keep = sorted({o + k for w, o in zip(windows, starts) for k in w.reads}) or [ids.shape[1] - 1]
        padding = torch.arange(ids.shape[1])[None, :] < torch.tensor(starts)[:, None]  # (b, W): nobody reads these
        logits = cache.forward(ids, pos, local, keep, padding)  # (b, len(keep), V) float32
        at = {k: j for j, k in enumerate(keep)}

        # 2. score and 3. accept, row by row, each by its own mode and settings
        computed = [w.n_real for w in windows]  # per row: leading window inputs computed from real tokens
        records = []
        for i, (r, plan, w, o, tau) in enumerate(zip(slots, plans, windows, starts, taus)):
            if r is None:
                continue
            r.passes += 1
            if plan is None:
                continue
            r.passes_planned += 1
            row_logits = logits[i]  # (len(keep), V)
            main = _rows(row_logits, [at[o + k] for k in w.main_reads])
            groups = _Groups(row_logits, w.group_reads, at, o)
            res = r.mode.accept(r, plan, main, groups, r.cfg, tau, r.gen)
            computed[i] += res.n_verified
            records.append(_accept(self.tok, r, plan, res, r.cfg, self.eos, r.passes - 1, tau, cache.length,
                                   ids.shape[1], r.mode.scoring))
            r.last_width, r.last_tokens = len(w.tokens), len(records[-1].token_ids)

        # 4. commit: each row keeps the KV it computed from real inputs, all but its last token (fed next pass
        # as the query); finished rows leave the batch; holes are packed away once they dominate the cache
        widths = [len(w.tokens) for r, w in zip(slots, windows) if r is not None]  # before rows leave their slots
        counts = [min(c, len(r.tokens) - 1 - r.n_cached) if r is not None else 0 for r, c in zip(slots, computed)]
        for r, kept in zip(slots, cache.commit(starts, counts)):
            if r is not None:
                r.n_cached += kept
        done = [i for i, r in enumerate(slots) if r is not None and r.finish_reason is not None]
        if done:
            self._leave(done)
        if self.cache is not None:
            self.cache.compact_if_sparse()
        elapsed = time.perf_counter() - t0
        for rec in records:
            rec.seconds = elapsed
            rec.batch_rows = len(rows)
        self.last = PassStats(len(rows), sum(widths), widths, elapsed, sum(len(rec.token_ids) for rec in records),
                              sum(len(w.tokens) for w, p in zip(windows, plans) if p is not None))
        return records


def _accept(tok, row: Row, plan: RowPlan, res: Outcome, cfg, eos: set[int], pass_index: int,
            tau: float, cache_len: int, width: int, scoring=None) -> PassRecord:
    """Stage 3 for one row: cut the mode's accepted run at EOS, the length limit and stop strings; take
    the tokens into the row; return the pass's record."""
    props = res.tokens
    n, reason = _apply_limits(props, len(props), len(row.generated), cfg.max_new_tokens, eos)
    n, reason, piece = take(tok, row, props, n, cfg.stop_strings, reason)
    accepted = props[:n]
    cands = None
    if cfg.top_k and res.proposal_logits is not None:
        probs = top_probs(res.proposal_logits, min(cfg.top_k, res.proposal_logits.shape[-1]), scoring)
        cands = [list(zip(ix.tolist(), [round(v, 6) for v in pv.tolist()])) for pv, ix in zip(*probs)]
    return PassRecord(
        row=row.index,
        pass_index=pass_index,
        token_ids=accepted,
        text=piece,
        confidences=res.confidences[:n],
        rejected_token_ids=props[n:] + res.rejected,
        rejected_confidences=res.confidences[n:] + res.rejected_confidences,
        tau=tau,
        seconds=0.0,  # the pass's wall time, set once every row is done
        cache_len=cache_len,
        input_len=width,
        finish_reason=reason,
        candidates=cands,
        drafts_sent=len(plan.to_verify),
        draft_source=plan.source,
        tree_depths=res.tree_depths,
        tree_path=res.tree_path,
        repeat_guard=res.repeat_guard and n == len(props),  # not when EOS, the length or a stop string cut first
    )


@dataclass
class _RowWindow:
    tokens: list[int]
    positions: list[int]
    allowed: torch.Tensor  # (n, n) bool: which window inputs each window input may attend to (masks.window_mask)
    main_reads: list[int]  # window indices of the last real token and of each extra
    group_reads: list[list[int]]  # window indices of each mask group
    n_real: int  # leading inputs that are the row's uncommitted tokens

    @property
    def reads(self) -> list[int]:
        return self.main_reads + [k for g in self.group_reads for k in g]


_NOTHING = _RowWindow([], [], torch.zeros((0, 0), dtype=torch.bool), [], [], 0)  # a free slot's window


def _window(row: Row, plan: RowPlan | None, mask_id: int | None, limit: int | None = None) -> _RowWindow:
    """One row's part of the forward input: [its uncommitted tokens | the plan's extras | mask groups].

    The extras are a chain or a tree (plan.parents), each at the position of its depth after the last real
    token; mask group (j, n) holds n masks at the positions right after extra j-1. Who sees whom is
    `masks.window_mask`. A row without a plan (idle, or in its prefill) feeds its uncommitted tokens but the
    last, at most `limit` of them, which its next plan feeds as the query: nothing at all once they are cached.
    """
    real = row.tokens[row.n_cached:] if plan else row.tokens[row.n_cached:-1][:limit]
    extra = plan.to_verify if plan else []
    groups = plan.groups if plan else []
    parents = plan.parents if plan else None
    n_real = len(real)
    if plan and n_real < 1:
        raise RuntimeError(f"row {row.index}: no uncached token to feed ({row.n_cached} of {len(row.tokens)} cached)")
    n = len(row.tokens)  # the position of the token after the last real one
    tokens = real + list(extra)
    positions = list(range(row.n_cached, row.n_cached + n_real))
    depth = tree_depths(parents, len(extra))
    positions += [n + d - 1 for d in depth]
    group_reads = []
    for j, m in groups:
        group_reads.append(list(range(len(tokens), len(tokens) + m)))
        tokens += [mask_id] * m
        after = depth[j - 1] if j else 0  # the depth of the extra the group follows
        positions += [n + after + o for o in range(m)]
    main_reads = list(range(n_real - 1, n_real + len(extra))) if plan else []
    return _RowWindow(tokens, positions, window_mask(0, n_real, len(extra), groups, parents), main_reads,
                      group_reads, n_real)


def _stack_windows(windows: list[_RowWindow], pad_id: int):
    """The rows' windows right-aligned in a common width W: ids, positions (b, W), masks (b, W, W), and each
    row's first column. Right-aligned, the rows' last real tokens and masks share columns (a MARS pass reads
    the last B of every row), so the logits kept are few; the left padding is what the fast backend skips
    (BlockCache.forward's `padding`)."""
    W = max(len(w.tokens) for w in windows)
    b = len(windows)
    starts = [W - len(w.tokens) for w in windows]
    # ids and positions padded as lists and made tensors at once: two tensors a pass, not two a row
    ids = torch.tensor([[pad_id] * o + w.tokens for w, o in zip(windows, starts)], dtype=torch.long)
    pos = torch.tensor([[0] * o + w.positions for w, o in zip(windows, starts)], dtype=torch.long)
    local = torch.zeros((b, W, W), dtype=torch.bool)
    for i, (w, o) in enumerate(zip(windows, starts)):
        local[i, o:, o:] = w.allowed
    return ids, pos, local, starts


class _Groups(Sequence):
    """A row's mask groups' logits, each cut out of the pass's logits only when the mode reads it: a tree
    pass carries a group per node and reads one of them."""

    def __init__(self, logits: torch.Tensor, reads: list[list[int]], at: dict[int, int], start: int = 0):
        # logits: (len(keep), V); at: pass column -> logits row; start: the row's window's first column
        self.logits, self.reads, self.at, self.start = logits, reads, at, start

    def __len__(self) -> int:
        return len(self.reads)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return _rows(self.logits, [self.at[self.start + k] for k in self.reads[i]])


def _rows(logits: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """logits[idx]; a run of consecutive rows as a slice: indexing a GPU's tensor with a list copies the
    list there first, and waits for the device to do so."""
    if idx and idx == list(range(idx[0], idx[0] + len(idx))):
        return logits[idx[0]:idx[0] + len(idx)]
    return logits[idx]


def _apply_limits(props: list[int], n: int, n_generated: int, max_new: int, eos: set[int]):
    """Cut the accepted run at the first EOS (kept) and at max_new_tokens."""
    for j in range(n):
        if props[j] in eos:
            n = j + 1
            break
    n = min(n, max_new - n_generated)
    if props[n - 1] in eos:
        return n, "eos"
    return n, ("length" if n_generated + n >= max_new else None)
