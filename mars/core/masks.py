"""Every attention mask of the project, as pure functions of sizes: True = the query (row) may attend to
the key (column).

  training   `mars_attention_mask(L, B, noisy_start)`: the [clean | noisy] mask of one training sequence;
             `multi_copy_mask`: [clean | noisy_1 | noisy_2 ...] with shifted block grids. Rules (docs/method.md),
             with block(t) = t // B counted from position 0 of the sequence (or from a grid offset):
               clean -> clean : k <= q                       (causal)
               noisy -> noisy : block(k) == block(q), k <= q (causal inside the block)
               noisy -> clean : block(k) <  block(q)         (strictly earlier clean blocks)
               clean -> noisy : never
  inference  `window_mask`: one row's part of a decoding pass (its uncached real tokens, drafts fed as
             real tokens, as a chain or a tree, groups of masks); `pass_mask`: the rows' windows behind
             their cached columns.
  additive   `additive_mask`: a boolean mask as the float mask attention adds to its scores.
"""

from __future__ import annotations

import functools

import torch


def window_mask(n_pad: int, n_real: int, n_extra: int, groups: list[tuple[int, int]],
                parents: list[int] | None = None) -> torch.Tensor:
    """(n, n) bool mask of one row's window, laid out as
        [n_pad padding | n_real real tokens | n_extra extras | group 0's masks | group 1's masks | ...]
    with n = n_pad + n_real + n_extra + the groups' sizes.

    Padding and real tokens: causal, as an ordinary sequence; padding is never a key.
    Extras form a tree over the last real token (the root): parents[i] is extra i's parent (-1: the root;
    a parent comes before its children). Extra i sees the real tokens, its ancestors and itself, so every
    branch reads as its own sequence (tree attention, as Medusa and EAGLE-2 verify drafts). parents None:
    a chain [-1, 0, 1, ...], each extra after the previous one (plain causal).
    Mask group (j, m): m masks placed right after extra j-1 (j = 0: right after the real tokens); each sees
    the real tokens, extra j-1 and its ancestors (for a chain: the first j extras) and the group's earlier
    masks (causal inside the group, as in training), nothing else.
    A padding query sees nothing here; `pass_mask` lets it see itself.

    A pass builds one per row, so it is built in a few whole-tensor operations (no loop over groups or
    nodes), and kept per shape: a MARS or chain-verified row repeats a handful of shapes all run long, and
    a tree grown from similar candidates often has the same shape as the last one. Returns a fresh tensor
    (the caller may write to it).
    """
    groups = tuple((int(j), int(m)) for j, m in groups)
    parents = None if parents is None else tuple(parents)
    if n_pad + n_real + n_extra + sum(m for _, m in groups) <= MAX_CACHED_WINDOW:
        return _cached_window_mask(n_pad, n_real, n_extra, groups, parents).clone()
    return _window_mask(n_pad, n_real, n_extra, groups, parents)


MAX_CACHED_WINDOW = 192  # windows kept per shape up to this size (a 32-node tree with groups: 132): 1024 hold <= 36 MiB


@functools.lru_cache(maxsize=1024)  # thread-safe; a batch of trees brings a few hundred shapes per run
def _cached_window_mask(n_pad: int, n_real: int, n_extra: int, groups: tuple[tuple[int, int], ...],
                        parents: tuple[int, ...] | None) -> torch.Tensor:
    return _window_mask(n_pad, n_real, n_extra, groups, parents)


def _window_mask(n_pad: int, n_real: int, n_extra: int, groups: tuple[tuple[int, int], ...],
                 parents: tuple[int, ...] | None) -> torch.Tensor:
    seen_by = _ancestors(n_extra, None if parents is None else list(parents))  # (n_extra, n_extra): i sees k
    for j, _ in groups:
        if not 0 <= j <= n_extra:
            raise ValueError(f"mask group after extra {j - 1}: there are {n_extra} extras")
    n_head = n_pad + n_real
    n_main = n_head + n_extra
    sizes = [m for _, m in groups]
    size = n_main + sum(sizes)
    idx = torch.arange(size)
    is_key = (idx >= n_pad) & (idx < n_head)
    allowed = torch.zeros(size, size, dtype=torch.bool)
    allowed[:n_head, :n_head] = (idx[None, :n_head] <= idx[:n_head, None]) & is_key[None, :n_head]
    allowed[n_head:, :n_head] = is_key[None, :n_head]  # extras and masks see every real token
    allowed[n_head:n_main, n_head:n_main] = seen_by
    if size > n_main:
        counts = torch.tensor(sizes)
        # per mask: its group's j, and its group's index (masks see the earlier masks of their own group only)
        js = torch.tensor([j for j, _ in groups]).repeat_interleave(counts)
        gid = torch.arange(len(groups)).repeat_interleave(counts)
        after = torch.cat([torch.zeros(1, n_extra, dtype=torch.bool), seen_by])  # row j: what extra j-1 sees
        allowed[n_main:, n_head:n_main] = after[js]
        g = idx[n_main:]
        allowed[n_main:, n_main:] = (gid[None, :] == gid[:, None]) & (g[None, :] <= g[:, None])
    return allowed


def _ancestors(n: int, parents: list[int] | None) -> torch.Tensor:
    """(n, n) bool: [i, k] = extra k is extra i or one of its ancestors."""
    if parents is None:
        return torch.ones(n, n, dtype=torch.bool).tril()
    if len(parents) != n or any(not -1 <= p < i for i, p in enumerate(parents)):
        raise ValueError(f"parents must give each of the {n} extras an earlier extra or -1 (the root), got {parents}")
    # every node climbs to the root one step per round, marking what it passes: as many rounds as the tree is deep
    up = torch.tensor(parents + [-1], dtype=torch.long)  # up[-1] = -1: the root stays put
    out = torch.zeros(n, n + 1, dtype=torch.bool)  # column n: the root, dropped at the end
    rows = torch.arange(n)
    node = rows
    for _ in range(n):
        out[rows, node] = True
        node = up[node]
        if bool((node < 0).all()):
            break
    return out[:, :n]


def tree_depths(parents: list[int] | None, n: int) -> list[int]:
    """Depth of each of n extras (1: a child of the root, the column right after the last real token);
    parents None: a chain, 1, 2, ..., n. An extra's position id is the last real token's plus its depth."""
    if parents is None:
        return list(range(1, n + 1))
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def pass_mask(cached_keys: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """The mask of one forward pass: (b, W, C + W) bool from the C cached columns and the W window columns.

    cached_keys: (b, C) bool, False for left padding (every window input sees every cached real token).
    local: (b, W, W) bool, the rows' `window_mask`s padded to W.
    Every query also sees itself, so the right padding of a short window (and left padding) has a key:
    a query that sees nothing would give NaN, and NaN spreads.
    """
    b, W, _ = local.shape
    C = cached_keys.shape[1]
    allowed = torch.cat([cached_keys[:, None, :].expand(b, W, C), local], dim=2)
    allowed[:, torch.arange(W), C + torch.arange(W)] = True
    return allowed


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (..., q, k) -> float mask on the same device: 0 where allowed, the dtype's minimum elsewhere.

    An additive float mask means the same thing to transformers' eager and SDPA attention alike, and the
    fast path builds it once per pass instead of once per layer.
    """
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


def _blocks(pos: torch.Tensor, block_size: int, offset: int) -> torch.Tensor:
    """Block index of each position on the grid whose blocks start at offset + k*B (positions before the
    offset form block -1); offset 0 gives t // B."""
    return torch.div(pos - offset, block_size, rounding_mode="floor")


def mars_attention_mask(length: int, block_size: int, noisy_start: int = 0, offset: int = 0) -> torch.Tensor:
    """Boolean (L + L - s, L + L - s) mask for one sequence laid out as [clean 0..L-1 | noisy s..L-1].

    True = the query (row) may attend to the key (column). `noisy_start` must be a block boundary of the
    grid shifted by `offset` (blocks start at offset + k*B; 0 is always a boundary).
    """
    return multi_copy_mask(length, block_size, [(noisy_start, length, offset)])


def multi_copy_mask(length: int, block_size: int, copies: list[tuple[int, int, int]]) -> torch.Tensor:
    """Boolean mask for [clean 0..L-1 | noisy_1 | noisy_2 | ...]: copy k = (start, end, offset) holds
    positions start..end-1 on the block grid shifted by `offset`.

    Each noisy copy follows the rules of the module docstring on its own grid: it sees the clean blocks
    strictly before its block (on its grid) and its own block causally; it never sees another noisy copy,
    and the clean copy sees no noisy copy.
    """
    B = block_size
    if block_size < 1 or length < 1:
        raise ValueError("length and block_size must be >= 1")
    for start, end, offset in copies:
        if not 0 <= offset < B:
            raise ValueError(f"offset {offset} must be in [0, {B})")
        if (start and (start - offset) % B) or not 0 <= start <= end <= length:
            raise ValueError(f"noisy_start {start} must be a block boundary inside [0, {length}]")
    clean_pos = torch.arange(length)
    n_total = length + sum(end - start for start, end, _ in copies)
    mask = torch.zeros(n_total, n_total, dtype=torch.bool)
    mask[:length, :length] = clean_pos[None, :] <= clean_pos[:, None]
    at = length
    for start, end, offset in copies:
        pos = torch.arange(start, end)
        n = len(pos)
        bq = _blocks(pos, B, offset)
        mask[at:at + n, :length] = _blocks(clean_pos, B, offset)[None, :] < bq[:, None]
        mask[at:at + n, at:at + n] = (bq[None, :] == bq[:, None]) & (pos[None, :] <= pos[:, None])
        at += n
    return mask
