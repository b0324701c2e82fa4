"""The decoder's KV cache state: which columns hold which row's keys, where the current cache block ends; over
a backend's storage (mars/runtime/backends.py), which it alone drives.

Layout (mars/decoding/decoder.py): every pass writes its window (b, W) at columns [length, length + W), each
row's window right-aligned in it. `commit` then keeps, per row, the window inputs it computed from real
inputs (its fed tokens, plus drafts that were verified), and the cache grows by the most any row keeps; the
backend drops the rest (masks, rejected drafts) by position, as gpt-fast's cache does. A row that keeps
fewer columns than another leaves holes: columns that are never its keys (`key_ok` False), like the
padding in front of a short prompt. So each row commits all it computed, whatever the others did, and never
feeds a token twice: a row's query sees its keys in order and nothing else, so its result is the same as
alone (the attention skips keys it may not see; mars/runtime/csrc/layers.c).

Verbs (compare nanochat's KVCache): `length`, `forward` (one pass over the committed columns),
`commit`, `select` (rows leave the batch), `add_rows` (rows join it: mars.decoding.scheduler), `compact` (each
row's keys packed to the left, holes dropped), `next_block` (the block-level cache of the paper's Fig. 4).

Rows that come and go (the app's server) leave holes behind: a joining row's prompt columns are holes for every
other row, and a finished row's columns for all. `compact_if_sparse` packs each row's keys to the left once the
cache is more than twice as long as the row with the most keys needs: the cache then stays within twice the
longest row, whatever the traffic, and a packing halves it at least (so its copy is paid rarely).
"""

from __future__ import annotations

import torch

from mars.decoding.masks import pass_mask


class BlockCache:
    """Committed columns of a batch's KV cache and the cache block the rows are filling."""

    def __init__(self, runner, prompt_len: int, rows: int, cache_block: int | None, use_cache: bool):
        # runner: a backend made for this run (mars.runtime.backends: sized for it, it grows if need be);
        # uncached runs keep no column between passes. cache_block None: no row ever idles
        self.runner = runner
        self.use_cache = use_cache
        self.key_ok = torch.zeros((rows, 0), dtype=torch.bool)  # (b_live, length): False for padding and holes
        self.cache_block = cache_block
        # rows idle at this column until every row has reached it
        self.block_end = None if cache_block is None else prompt_len + cache_block

    @property
    def length(self) -> int:
        return self.key_ok.shape[1]

    def next_block(self, frontiers: list[int]) -> int | None:
        """The current cache-block end, moved on while every row has reached it (frontiers: each row's logical
        column, its left padding to the longest prompt plus its tokens); None without cache blocks."""
        if self.block_end is None:
            return None
        while all(f >= self.block_end for f in frontiers):
            self.block_end += self.cache_block
        return self.block_end

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, local: torch.Tensor, keep: list[int],
                padding: torch.Tensor | None = None) -> torch.Tensor:
        """One pass of windows (b, W) after the committed columns; logits (b, len(keep), V) of inputs `keep`.
        padding: (b, W) bool, the inputs no row reads (never committed as keys), for a backend that can skip them
        (`skips_padding`); their logits are then zeros."""
        allowed = pass_mask(self.key_ok, local)
        if padding is not None and getattr(self.runner, "skips_padding", False) and bool(padding.any()):
            return self.runner.forward(ids, positions, allowed, keep, padding=padding)
        return self.runner.forward(ids, positions, allowed, keep)

    def commit(self, starts: list[int], counts: list[int]) -> list[int]:
        """Keep, per row r, the KV of window inputs [starts[r], starts[r] + counts[r]) of the last pass (what it
        computed from real inputs and will not feed again); drop the rest. Returns what each row kept (all
        zeros in an uncached run, which keeps nothing)."""
        if not self.use_cache:
            counts = [0] * len(counts)
        n = max((s + c for s, c in zip(starts, counts) if c), default=0)
        cols = torch.arange(n)[None, :]  # (1, n): the pass's window columns kept, holes included
        lo = torch.tensor(starts)[:, None]
        new = (cols >= lo) & (cols < lo + torch.tensor(counts)[:, None])
        self.key_ok = torch.cat([self.key_ok, new], dim=1)
        self.runner.truncate(self.length)
        return list(counts)

    def select(self, rows: list[int]):
        """Keep these rows (in this order): finished rows leave the batch."""
        if rows:
            self.runner.select(rows)
        self.key_ok = self.key_ok[rows]

    def add_rows(self, n: int):
        """n new rows at the end of the batch, with no key yet (every column is a hole for them)."""
        self.runner.add_rows(n)
        self.key_ok = torch.cat([self.key_ok, torch.zeros((n, self.length), dtype=torch.bool)])

    def compact(self):
        """Pack each row's keys to the left, in their order: row r's keys become its first n_r columns, and the
        cache is as long as the row with the most keys. A row's attention reads its keys in column order and
        skips what it may not see, so where its keys sit changes no token (tests/test_scheduler.py)."""
        counts = self.key_ok.sum(1)
        n = int(counts.max()) if counts.numel() else 0
        # each row's key columns first, in order (a stable sort of "is a hole"), cut at n: (b, n)
        order = torch.sort((~self.key_ok).to(torch.int8), dim=1, stable=True).indices[:, :n]
        self.runner.compact(order)
        self.key_ok = torch.arange(n)[None, :] < counts[:, None]

    def compact_if_sparse(self) -> bool:
        """compact() when the cache is more than twice as long as its fullest row needs (and long enough for the
        copy to matter); True if it did."""
        if not self.use_cache or self.length < 64 or not self.key_ok.shape[0] or not hasattr(self.runner, "compact"):
            return False  # (a runner without the verb, a test's stand-in, keeps its holes)
        if 2 * int(self.key_ok.sum(1).max()) >= self.length:
            return False
        self.compact()
        return True
