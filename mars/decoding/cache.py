"""The decoder's KV cache state: which columns are committed, which of them are keys, where the current
cache block ends; over a backend's storage (mars/runtime/backends.py), which it alone drives.

Layout (mars/decoding/decoder.py): prompts are left-padded to a common length P, so row r's i-th token sits in
column pad_r + i for every row. Columns [0, length) are committed: their KV was computed from real inputs
and is kept. A pass writes its window after them; `commit` then keeps what every row computed from real
inputs and the backend drops the rest (masks, rejected drafts) by position, as gpt-fast's cache does.

Verbs (compare nanochat's KVCache): `length`, `forward` (one pass over the committed columns),
`commit`, `select` (rows leave the batch), `next_block` (the block-level cache of the paper's Fig. 4).
"""

from __future__ import annotations

import torch

from mars.decoding.masks import pass_mask


class BlockCache:
    """Committed columns of a batch's KV cache and the cache block the rows are filling."""

    def __init__(self, runner, prompt_len: int, pads: list[int], cache_block: int, use_cache: bool):
        # runner: a backend made for this run (mars.runtime.backends: sized for it, it grows if need be);
        # uncached runs keep no column between passes
        self.runner = runner
        self.use_cache = use_cache
        self.pads = list(pads)  # left padding per live row: its columns are never keys
        self.key_ok = torch.zeros((len(pads), 0), dtype=torch.bool)  # (b_live, length): False for left padding
        self.cache_block = cache_block
        self.block_end = prompt_len + cache_block  # rows idle at this column until every row has reached it

    @property
    def length(self) -> int:
        return self.key_ok.shape[1]

    def next_block(self, frontiers: list[int]) -> int:
        """The current cache-block end, moved on while every row has reached it."""
        while all(f >= self.block_end for f in frontiers):
            self.block_end += self.cache_block
        return self.block_end

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, local: torch.Tensor, keep: list[int]) -> torch.Tensor:
        """One pass of windows (b, W) after the committed columns; logits (b, len(keep), V) of inputs `keep`."""
        return self.runner.forward(ids, positions, pass_mask(self.key_ok, local), keep)

    def commit(self, valid: list[int], frontiers: list[int]):
        """Keep the columns every row computed from real inputs; drop the pass's other columns.

        valid[r]: the column after row r's last input computed from a real token this pass (its fed tokens,
        plus drafts that were verified). frontiers[r]: the column after row r's last accepted token. Every
        row also keeps its last token uncommitted, to feed it (as the query) next pass: a row idling at the
        cache-block end while another row's verified extras run past it would otherwise have nothing to feed.
        """
        C = self.length
        if self.use_cache:
            n = min(min(valid), min(frontiers) - 1) - C
            new = torch.arange(C, C + n)[None, :] >= torch.tensor(self.pads)[:, None]  # (b, n): past the left padding
            self.key_ok = torch.cat([self.key_ok, new], dim=1)
        self.runner.truncate(self.length)

    def select(self, rows: list[int]):
        """Keep these rows (in this order): finished rows leave the batch."""
        if rows:
            self.runner.select(rows)
        self.key_ok = self.key_ok[rows]
        self.pads = [self.pads[i] for i in rows]
