"""Lossless tree drafts: the verified mode checking several candidate continuations in one pass.

The chain verified mode (mars.decoding.modes.VerifiedMode) feeds the previous pass's top-1 mask drafts and
accepts the prefix the model's own AR choices confirm. Here the pass feeds a tree of drafts instead, as
Medusa and EAGLE-2 do, with the mask positions as the draft heads (no extra parameter):

  grow_tree   from the previous pass's mask distributions (top-k per depth) and the n-gram lookup's
              copies (a branch of their own; where the text offers no copy of 2+ matched tokens, a chain from
              the datastore of the model's own answers, mars.decoding.datastore, when DecodeConfig.datastore),
              the N nodes most likely to lie on the accepted path, grown
              best-first by the product of the path's draft probabilities (EAGLE-2's rule). Mask positions
              see only masks, so the candidates at depth d are the same under every parent: a product tree
              (Medusa-style), not EAGLE-2's conditioned one.
  layout      depth-first, each node's likeliest child right after it: the top-1 chain comes first, so
              when the accepted path is that chain (the common case) its KV is committed as today; a path
              off it is re-fed as real tokens next pass (exact; the cache keeps a contiguous prefix only).
  attention   each node sees the cache, the row's real tokens, its ancestors and itself
              (masks.window_mask with parents); position ids by depth.
  walk        from the root (the last real token), follow the child equal to the model's own greedy token
              while there is one: those drafts, plus the model's token after the last of them, are accepted.
              Every accepted token is the model's greedy choice after the accepted text: AR's text exactly.
  groups      a mask group after a node proposes the next pass's drafts if the path ends there; groups sit
              on every node (verify_groups "all") or on the few nodes likeliest to end the path ("last",
              DecodeConfig.tree_groups of them). A path that ends elsewhere takes its drafts from its nearest
              ancestor's group, whose later masks still point at the right positions (farther ahead: weaker
              drafts).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from mars.decoding.acceptance import calibrate_logits, choose_and_score, to_host, top_probs
from mars.decoding.datastore import store_values
from mars.decoding.lookup import ACCEPTED_SHARE, MAX_NGRAM, lookup_drafts
from mars.decoding.masks import tree_depths
from mars.decoding.plan import Outcome, RowPlan

# The node budget N by device. CPU: measured (2 threads, int8, 20 held-out prompts x 96 tokens, groups on the
# 3 likeliest ends): N = 4, 8, 16, 32, 64 gave 0.98x, 0.94x, 0.90x, 0.71x, 0.53x core AR on the clock at
# 1.95-2.34 tokens/pass: every input costs time there, so a small tree is the fastest; with the weights
# prefetched and one group (10 prompts x 64 tokens, B 2): N = 2, 3, 4, 6, 8 gave 1.11x, 1.12x, 1.10-1.13x,
# 1.11x, 1.07x (docs/tree.md). GPU: NOT measured yet; a wider pass costs almost nothing there, so more nodes
# only add accepted tokens (N = 32: ~2.3).
DEFAULT_TREE_NODES = {"cpu": 4, "cuda": 32}
MAX_BRANCH = 16  # candidates kept per depth between passes: top-8 already holds 84% of depth 1 (FINDINGS)
# verify_groups "last": mask groups per tree by device (DecodeConfig.tree_groups None). CPU: 1 (10 held-out
# prompts x 64 tokens, B 2: trees of 2-6 nodes 1.11-1.13x int8 AR with 1 group, 1.05-1.10x with 2 or 3; each
# group is a gated input). GPU: 3, as measured before; 1 is not measured there.
DEFAULT_TREE_GROUPS = {"cpu": 1, "cuda": 3}
GAIN_RATE = 0.2  # a row's running mean of the mask group's worth follows its last ~5 passes with masks
GAIN_PASSES = 4  # passes with masks measured before that mean decides; until then the group goes
EXPLORE_EVERY = 16  # a row whose group stopped sends it once in this many passes, so its worth stays measured


def default_tree_groups(device_type: str) -> int:
    """Mask groups per tree (verify_groups "last") on this kind of device; unknown kinds get the CPU's."""
    return DEFAULT_TREE_GROUPS.get(device_type, DEFAULT_TREE_GROUPS["cpu"])


def default_tree_nodes(device_type: str) -> int:
    """The node budget for a model on this kind of device (`torch.device.type`); unknown kinds get the CPU's."""
    return DEFAULT_TREE_NODES.get(device_type, DEFAULT_TREE_NODES["cpu"])


@dataclass
class DraftTree:
    """Draft tokens as a tree over the row's last real token (the root), in depth-first order."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: the root
    values: list[float] = field(default_factory=list)  # estimated chance the node lies on the accepted path
    probs: list[float] = field(default_factory=list)  # the node's own draft probability (a copy's: its share)
    copied: list[bool] = field(default_factory=list)  # from n-gram lookup (else from a mask position)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        return tree_depths(self.parents, len(self))

    def children(self) -> dict[tuple[int, int], int]:
        """(parent, token) -> node."""
        return {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens))}

    def candidates_by_depth(self) -> list[list[int]]:
        """The distinct tokens at each depth, likeliest first."""
        out: list[dict[int, float]] = []
        for d, t, v in zip(self.depths, self.tokens, self.values):
            while len(out) < d:
                out.append({})
            out[d - 1][t] = max(v, out[d - 1].get(t, 0.0))
        return [sorted(c, key=lambda t: -c[t]) for c in out]


Dists = list[tuple[list[int], list[float]]]  # per depth: (top tokens, their probabilities), likeliest first


def grow_tree(dists: Dists, copies: list[int], budget: int, tau: float = 0.0, copy_share=(), cut=None) -> DraftTree:
    """The `budget` nodes with the highest path values, best first; with `cut` only the first `cut(values)` of
    them (values in the order the nodes entered: TreeMode._cut, by this machine's pass costs).

    dists[d-1]: the candidates for depth d (a mask position's top tokens); a mask node's value is its
    parent's times its probability, and only candidates with probability >= tau enter (tau >= 1: none).
    copies: a lookup chain under the root; copy k's value is copy_share[k] (the measured chance that it is
    accepted). A token proposed by both sources is one node, with the larger value. Children are pushed when
    their parent enters, so the tree is closed under ancestors whatever the values.

    Candidates come likeliest first, so a node's children enter the heap one at a time: the next sibling when
    the previous one leaves it (each keeps the heap order, value then push order, it would have had if all
    were pushed at once, so the tree is the same; a list that is not sorted is pushed whole).
    """
    tree = DraftTree()
    at: dict[tuple[int, int], int] = {}
    # (-value, seq, parent, token, prob, copy index, sibling): sibling = (tokens, probs, i, count, value, base, parent)
    heap: list[tuple] = []
    seq = 0

    # per depth, once: its candidates, how many pass tau (up to the first one below it), whether likeliest first
    levels = []
    for toks, probs in dists if tau < 1.0 else ():
        count = 0
        for _, p in zip(toks, probs):
            if p < tau:
                break
            count += 1
        levels.append((toks, probs, count, all(probs[i + 1] <= probs[i] for i in range(count - 1))))

    def push_masks(parent: int, depth: int, value: float):
        nonlocal seq
        if depth > len(levels) or not levels[depth - 1][2]:
            return
        toks, probs, count, in_order = levels[depth - 1]
        base, seq = seq, seq + count  # the push order of all `count` children, reserved now
        if in_order:
            heapq.heappush(heap, (-value * probs[0], base, parent, toks[0], probs[0], -1,
                                  (toks, probs, 0, count, value, base, parent)))
        else:
            for i in range(count):
                heapq.heappush(heap, (-value * probs[i], base + i, parent, toks[i], probs[i], -1, None))

    def push_sibling(sib):
        toks, probs, i, count, value, base, parent = sib
        if i + 1 < count:
            j = i + 1
            heapq.heappush(heap, (-value * probs[j], base + j, parent, toks[j], probs[j], -1,
                                  (toks, probs, j, count, value, base, parent)))

    def push_copy(parent: int, k: int):
        nonlocal seq
        if k < len(copies):
            share = copy_share[k] if k < len(copy_share) else 0.0
            heapq.heappush(heap, (-share, seq, parent, copies[k], share, k, None))
            seq += 1

    push_masks(-1, 1, 1.0)
    push_copy(-1, 0)
    while heap and len(tree) < budget:
        neg, _, parent, t, p, k, sib = heapq.heappop(heap)
        if sib is not None:
            push_sibling(sib)
        if (parent, t) in at:  # both sources proposed it: the copy chain continues under the one node
            node = at[(parent, t)]
            if k >= 0 and not tree.copied[node]:
                tree.copied[node] = True
                push_copy(node, k + 1)
            continue
        node = len(tree)
        at[(parent, t)] = node
        tree.tokens.append(t), tree.parents.append(parent), tree.values.append(-neg)
        tree.probs.append(p), tree.copied.append(k >= 0)
        push_masks(node, (1 if parent < 0 else _depth(tree, parent) + 1) + 1, -neg)
        if k >= 0:
            push_copy(node, k + 1)
    if cut is not None:  # nodes entered best first, each after its parent: any first k are a tree
        k = cut(tree.values)
        tree = DraftTree(tree.tokens[:k], tree.parents[:k], tree.values[:k], tree.probs[:k], tree.copied[:k])
    return depth_first(tree)


def pass_cost(costs, width: int) -> float:
    """A pass of `width` inputs, relative to one input, from `costs` (index w-1: w inputs); past the table's
    end its last step goes on (never down)."""
    if width <= len(costs):
        return costs[width - 1]
    step = max(costs[-1] - costs[-2], 0.0) if len(costs) > 1 else 0.0
    return costs[-1] + step * (width - len(costs))


def best_cut(values: list[float], costs, width, shared: tuple[int, float] | None = None) -> int:
    return cut_rate(values, costs, width, shared=shared)[0]


def cut_rate(values: list[float], costs, width, bonus: float = 0.0, extra: float = 0.0,
             shared: tuple[int, float] | None = None) -> tuple[int, float]:
    """How many nodes to send, of `values` in the order they entered the tree: the k with the most expected
    tokens per unit of pass time, (1 + values[0] + ... + values[k-1]) / cost(width(k)). A node's value is the
    chance that it lies on the accepted path (calibrated: docs/tree.md), so the sum is the expected accepted
    drafts and the 1 the model's own token after them. Where a wider pass costs what a narrow one does (a
    GPU, AMX) every node pays; where each input costs time (2 cores without AMX: +0.8 ms on a 5 ms pass) a
    node worth a few percent does not. cut_rate: (k, its rate), with `bonus` tokens and `extra` cost on top of
    every k (a mask group's worth and its gated rows' cost, TreeMode._cut).

    shared: (inputs, expected tokens) of the other rows in the same forward pass (mars.decoding.scheduler). The
    rate is then the whole pass's, (their tokens + this row's) / cost(their inputs + this row's): a node goes
    only if it adds more tokens than its inputs cost everyone, so under load each row sends less, and a row
    alone (shared None or (0, 0)) cuts as before."""
    base_w, base_t = shared if shared else (0, 0.0)
    total = 1.0 + bonus + base_t
    best_k, best = 0, total / (pass_cost(costs, base_w + width(0)) + extra)
    for k, v in enumerate(values, 1):
        total += v
        rate = total / (pass_cost(costs, base_w + width(k)) + extra)
        if rate > best:
            best_k, best = k, rate
    return best_k, best


def _depth(tree: DraftTree, node: int) -> int:
    d = 1
    while tree.parents[node] >= 0:
        node, d = tree.parents[node], d + 1
    return d


def depth_first(tree: DraftTree) -> DraftTree:
    """The same tree in depth-first order, each node's children likeliest first: node i+1 is node i's
    likeliest child wherever node i has children, so the top-1 chain is nodes 0, 1, 2, ..."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, []).append(i)
    order: list[int] = []
    stack = sorted(kids.get(-1, []), key=lambda i: tree.values[i])  # the likeliest popped first
    while stack:
        i = stack.pop()
        order.append(i)
        stack += sorted(kids.get(i, []), key=lambda c: tree.values[c])
    new = {old: k for k, old in enumerate(order)}
    return DraftTree([tree.tokens[i] for i in order], [new.get(tree.parents[i], -1) for i in order],
                     [tree.values[i] for i in order], [tree.probs[i] for i in order],
                     [tree.copied[i] for i in order])


def group_anchors(tree: DraftTree, groups: int | None) -> list[int]:
    """The nodes (-1: the root) that get a mask group: all of them (groups None), or the `groups` likeliest
    to end the accepted path, by value minus the children's values (root value 1)."""
    if groups is None:
        return list(range(-1, len(tree)))
    end = {-1: 1.0, **dict(enumerate(tree.values))}
    for i, p in enumerate(tree.parents):
        end[p] -= tree.values[i]
    best = sorted(end, key=lambda i: -end[i])[:groups]
    return sorted(best)


def walk(tree: DraftTree, ar_tokens: list[int]) -> list[int]:
    """The accepted path: nodes whose token is the model's greedy choice after their parent.
    ar_tokens[0] follows the root, ar_tokens[i + 1] follows node i."""
    kids = tree.children()
    path, node = [], -1
    while (node, ar_tokens[node + 1]) in kids:
        node = kids[(node, ar_tokens[node + 1])]
        path.append(node)
    return path


def top_candidates(logits: torch.Tensor, k: int, temperatures=None, scoring=None) -> Dists:
    """(n, V) mask logits -> per mask: its top-k tokens and their (calibrated) probabilities; one copy to
    the host, so the logits may live on any device."""
    val, idx = top_probs(calibrate_logits(logits, temperatures, ar_rows=0).float(), min(k, logits.shape[-1]),
                         scoring)
    both = torch.stack([val, idx.to(val.dtype)]).tolist()  # (2, n, k)
    return [([int(t) for t in ts], ps) for ps, ts in zip(*both)]


class TreeMode:
    """The verified mode with a draft tree per pass (DecodeConfig.tree_nodes > 0)."""

    name = "verified"
    scoring = None  # the backend's faster scoring (mars.runtime.scoring), set by make_mode; None: torch ops

    def __init__(self, nodes: int, groups: str = "last", temperatures=None, drafts: str = "mars",
                 last_groups: int = 1, store=None, vocab: int | None = None, costs=None, group_cost=None):
        self.nodes = nodes  # the node budget N
        self.costs = costs  # relative pass cost by inputs: send only the nodes that pay (best_cut); None: all N
        self.group_cost = group_cost  # what mask rows cost on top (DecodeConfig.group_cost); None: the group always goes
        self.gain: dict[int, float] = {}  # row index -> running mean of mask-only drafts accepted per pass
        self.gain_n: dict[int, int] = {}  # row index -> passes with masks measured
        self.without: dict[int, int] = {}  # row index -> passes since its last mask group
        self.masked: dict[int, bool] = {}  # row index -> its current tree could hold mask drafts
        self.groups = None if groups == "all" else last_groups  # see the module docstring (DecodeConfig.tree_groups)
        self.temperatures = temperatures
        self.drafts = drafts  # "mars": mask candidates; "lookup": copies only; "both": both, as branches
        self.dists: dict[int, Dists] = {}  # row index -> next pass's candidates per depth
        self.trees: dict[int, DraftTree] = {}  # row index -> the tree its plan sent, until its accept
        self.store = store  # a mars.decoding.datastore.Datastore: chains where the text offers no good copy
        self.vocab = vocab  # the model's vocabulary size: a table built for another tokenizer drafts no id past it

    def plan(self, row, cfg, tau) -> RowPlan:
        n = cfg.block_size - 1
        dists = self.dists.get(row.index, []) if self.drafts != "lookup" else []
        cap = cfg.max_tokens_per_pass - 1 if cfg.max_tokens_per_pass is not None else None
        if cap is not None:
            dists = dists[:cap]
        copies, share, copy_name = [], (), "lookup"
        if self.drafts != "mars":
            look = lookup_drafts(row.tokens, max_drafts=cap)
            copies, share = look.drafts, ACCEPTED_SHARE.get(look.ngram, ACCEPTED_SHARE[MAX_NGRAM])
            if self.store is not None and look.ngram < 2:
                stored, probs = self.store.draft(row.tokens, self.nodes if cap is None else min(cap, self.nodes),
                                                 self.vocab)
                values = store_values(probs)
                if stored and (not copies or values[0] > share[0]):
                    copies, share, copy_name = stored, values, "store"
        n_groups = 0 if n < 1 or self.drafts == "lookup" else self.groups  # None: one on every node
        decided = {"group": n_groups != 0}
        cut = None
        if self.costs is not None:
            def cut(values):
                k, decided["group"] = self._cut(values, n, n_groups, row.index, getattr(row, "shared", None))
                return k
        tree = grow_tree(dists, copies, self.nodes, tau, share, cut=cut)
        if cap is not None:  # a copy chain can run deeper than the cap: keep the nodes within it
            tree = _prune(tree, cap)
        sources = [name for name, used in (("mars", not all(tree.copied)), (copy_name, any(tree.copied))) if used]
        source = "+".join(sources) or None  # "mars", "lookup", "store", "mars+lookup", "mars+store"
        groups = [(a + 1, n) for a in group_anchors(tree, self.groups)] if decided["group"] else []
        self.trees[row.index] = tree
        self.masked[row.index] = bool(dists)
        return RowPlan(to_verify=tree.tokens, groups=groups, source=source, to_verify_conf=tree.probs,
                       parents=tree.parents)

    def _cut(self, values: list[float], n: int, n_groups: int | None, index: int,
             shared: tuple[int, float] | None = None) -> tuple[int, bool]:
        """(nodes to send, whether the mask group goes too), by expected tokens per unit of time (cut_rate).
        The group's drafts pay off a pass later: its worth is the row's running mean of accepted drafts that only
        the masks proposed (self.gain); until that is measured, or with no group_cost to weigh, the group goes."""
        width = lambda k: 1 + k + n * (k + 1 if n_groups is None else min(n_groups, k + 1))  # noqa: E731
        gain = self.gain.get(index)
        idle = self.without.get(index, 0)
        if (n_groups == 0 or self.group_cost is None or self.gain_n.get(index, 0) < GAIN_PASSES
                or idle + 1 >= EXPLORE_EVERY):
            self.without[index] = 0
            return best_cut(values, self.costs, width, shared), n_groups != 0
        k_group, with_group = cut_rate(values, self.costs, width, gain, self.group_cost, shared)
        k_plain, without = cut_rate(values, self.costs, lambda k: 1 + k, shared=shared)
        self.without[index] = 0 if with_group >= without else idle + 1
        return (k_group, True) if with_group >= without else (k_plain, False)

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        tree = self.trees.pop(row.index)
        # greedy: the model's own choice after each input; both lists in one copy from the device
        ar_tok, ar_conf = to_host(*choose_and_score(main, "prob", scoring=self.scoring))
        path = walk(tree, ar_tok)
        if self.masked.pop(row.index, False):  # the masks' worth: their accepted drafts that no copy proposed
            got = sum(1 for i in path if not tree.copied[i])
            old = self.gain.get(row.index)
            self.gain[row.index] = float(got) if old is None else old + GAIN_RATE * (got - old)
            self.gain_n[row.index] = self.gain_n.get(row.index, 0) + 1
        end = path[-1] if path else -1
        rows = [0] + [i + 1 for i in path]  # main's rows before each accepted token
        m = 0  # the accepted path's head on the top-1 chain (nodes 0, 1, ...): already in the cache's order
        while m < len(path) and path[m] == m:
            m += 1
        # the drafts shown as rejected: the likeliest continuation below the path's end (its first child's chain)
        rejected = []
        j = end + 1
        while j < len(tree) and tree.parents[j] == (end if not rejected else j - 1):
            rejected.append(j)
            j += 1
        depth_cands = tree.candidates_by_depth()
        out = Outcome([tree.tokens[i] for i in path] + [ar_tok[end + 1]], [ar_conf[r] for r in rows],
                      [tree.tokens[i] for i in rejected], [tree.probs[i] for i in rejected], n_verified=m,
                      proposal_logits=_take(main, rows), tree_depths=depth_cands, tree_path=[tree.tokens[i] for i in path])
        self.dists[row.index] = self._next_dists(tree, plan, end, groups)
        return out

    def _next_dists(self, tree: DraftTree, plan: RowPlan, end: int, groups: list[torch.Tensor]) -> Dists:
        """The next pass's candidates: the group after the path's end, or its nearest ancestor's later masks."""
        anchors = [j - 1 for j, _ in plan.groups]
        depth = tree.depths
        node, skip = end, 0
        while node not in anchors and node >= 0:
            node, skip = tree.parents[node], skip + 1
        if node not in anchors:
            return []
        g = groups[anchors.index(node)][skip:]
        if g.shape[0] == 0:
            return []
        temps = self.temperatures[skip:] if self.temperatures else None  # mask index = skip + row of g
        assert node < 0 or depth[end] - depth[node] == skip
        return top_candidates(g, min(self.nodes, MAX_BRANCH), temps, self.scoring)


def _take(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """logits[rows]; rows 0, 1, ..., k (a path on the top-1 chain: the common case) as a slice, which on a GPU
    needs no copy of the index list to the device."""
    if rows == list(range(len(rows))):
        return logits[: len(rows)]
    return logits[rows]


def _prune(tree: DraftTree, max_depth: int) -> DraftTree:
    keep = [i for i, d in enumerate(tree.depths) if d <= max_depth]  # depth-first order keeps parents first
    new = {old: k for k, old in enumerate(keep)}
    return DraftTree([tree.tokens[i] for i in keep], [new.get(tree.parents[i], -1) for i in keep],
                     [tree.values[i] for i in keep], [tree.probs[i] for i in keep], [tree.copied[i] for i in keep])
