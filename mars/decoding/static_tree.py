"""A fixed tree layout per node budget, for the device step (mars.decoding.device_step): EAGLE's and Medusa's
static trees, in this project's terms.

The host loop's tree (mars.decoding.tree.grow_tree) picks its N nodes every pass from the previous pass's mask
distributions. A captured step cannot change its shapes, so here the SHAPE is fixed once per (budget, depth):
node i is "the candidate of rank ranks[i] at depth d_i" under its parent, and each pass fills the tokens in
from the candidates the masks proposed (top-K per depth; a product tree, as the masks at depth d see no
draft). The shape is grown by the same best-first rule as the host tree, from a prior chance that the
rank-r candidate is the right one, so the likeliest paths get the nodes: the top-1 chain first (nodes 0,
1, ... after depth_first), whose KV is committed in place when the path follows it.

PRIOR is a guess of the shape of that chance (rank 0 about 0.6 on the shipped adapter's depth 1, FINDINGS:
top-8 holds 84%); it decides which nodes the budget buys, never which tokens are accepted (the walk checks
every node against the model's own tokens, so the text is AR's whatever the shape). Fitting it per depth on
a GPU's measured acceptance is left to the GPU session.
"""

from __future__ import annotations

from functools import lru_cache

from mars.decoding.tree import MAX_BRANCH, depth_first, grow_tree

MAX_STATIC_NODES = 64  # the budget inside graphs; the window is R + N + (depth + 1) * (B - 1) wide
PRIOR_DECAY = 0.6  # the chance of rank r, relative to rank 0, falls as 1 / (1 + r) ** (1 / PRIOR_DECAY)


def prior(rank: int) -> float:
    """The assumed chance that the rank-`rank` candidate of a depth is the accepted token."""
    return 0.6 / (1 + rank) ** (1 / PRIOR_DECAY)


@lru_cache(maxsize=64)
def static_tree(nodes: int, depth: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parents, ranks) of the fixed tree of `nodes` nodes at most `depth` deep (fewer where `depth` levels of
    tree.MAX_BRANCH candidates hold fewer), depth-first with each node's
    likeliest child right after it (the top-1 chain is nodes 0, 1, ..., depth - 1 where the budget allows)."""
    if not 1 <= nodes <= MAX_STATIC_NODES:
        raise ValueError(f"a static tree has 1 to {MAX_STATIC_NODES} nodes, got {nodes}")
    if depth < 1:
        raise ValueError("a static tree needs depth >= 1 (block size >= 2: a mask to propose from)")
    ranks = list(range(MAX_BRANCH))
    level = (ranks, [prior(r) for r in ranks])
    tree = depth_first(grow_tree([level] * depth, [], nodes))  # tokens = ranks (distinct under each parent)
    return tuple(tree.parents), tuple(tree.tokens)


def branch(ranks: tuple[int, ...]) -> int:
    """Candidates a pass must keep per depth for this tree (K)."""
    return max(ranks) + 1
