"""Tree drafts (mars.decoding.tree): the tree is grown, laid out and walked as written, and the verified mode
with a tree reproduces AR greedy decoding token for token: alone, in a batch, uncached, both backends, the
tiny Llama and Qwen2 and the default model, node budgets from 1 to 64."""

import pytest
import torch

from mars.decoding.decoder import DecodeConfig, decode_steps, encode_prompt, generate_ids
from mars.decoding.masks import tree_depths, window_mask
from mars.decoding.tree import DraftTree, default_tree_nodes, depth_first, group_anchors, grow_tree, top_candidates, walk

PROMPTS = [
    "what is the capital of france ?",
    "tell me a word",
    "add 2 + 3 = ?",
    "write a long sentence about the water and the earth and the air and the people who live here",
]
REPEAT_PROMPTS = [
    "the water and the earth and the air and the water and the earth and the",
    "one two three one two three one two",
]


def rows(*lines: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line] for line in lines])


# ---- the pieces, against small cases worked out by hand


def test_tree_window_mask_equals_hand_written_matrix():
    # [r1 r2 | extras a (root's child), b (a's child), c (root's child) | group after b: m m | group after c: m]
    got = window_mask(n_pad=0, n_real=2, n_extra=3, groups=[(2, 2), (3, 1)], parents=[-1, 0, -1])
    want = rows(
        "10000000",  # r1
        "11000000",  # r2
        "11100000",  # a sees the real tokens and itself
        "11110000",  # b sees a, its parent
        "11001000",  # c: a sibling of a, sees neither a nor b
        "11110100",  # group after b: the real tokens, a, b, then causal inside the group
        "11110110",
        "11001001",  # group after c: the real tokens and c only
    )
    assert torch.equal(got, want)
    assert tree_depths([-1, 0, -1, 1, 3], 5) == [1, 2, 1, 3, 4]
    # parents [-1, 0, 1, ...] is the chain: the same mask as without parents
    chain = window_mask(1, 2, 3, [(0, 2), (3, 1)])
    assert torch.equal(window_mask(1, 2, 3, [(0, 2), (3, 1)], parents=[-1, 0, 1]), chain)
    with pytest.raises(ValueError, match="parents"):
        window_mask(0, 1, 2, [], parents=[-1, 1])  # a node cannot be its own parent


def test_grow_tree_is_best_first_by_path_probability_and_depth_first_laid_out():
    dists = [([10, 11, 12], [0.6, 0.3, 0.1]), ([20, 21], [0.5, 0.4])]
    tree = grow_tree(dists, [], budget=4)
    # values: 10 .6, 11 .3, 10>20 .30, 10>21 .24, 11>20 .15, 12 .1: the best four, ties broken by arrival
    got = sorted(zip(tree.tokens, [tree.tokens[p] if p >= 0 else None for p in tree.parents], tree.values))
    assert got == sorted([(10, None, 0.6), (11, None, 0.3), (20, 10, 0.3), (21, 10, 0.24)])
    # depth first, likeliest child first: the top-1 chain is nodes 0, 1
    assert tree.tokens[:2] == [10, 20] and tree.parents[:2] == [-1, 0]
    assert all(p < i for i, p in enumerate(tree.parents))
    assert tree.candidates_by_depth() == [[10, 11], [20, 21]]
    assert len(grow_tree(dists, [], budget=64)) == 3 + 3 * 2  # the whole product tree
    assert grow_tree(dists, [], budget=4, tau=0.35).tokens == [10, 20, 21]  # candidates below tau never enter
    assert len(grow_tree(dists, [], budget=4, tau=1.0)) == 0


def test_copies_are_a_branch_of_their_own_and_merge_with_mask_candidates():
    dists = [([10, 11], [0.5, 0.2]), ([20], [0.9])]
    tree = grow_tree(dists, [11, 30, 31], budget=8, copy_share=(0.6, 0.4, 0.3))
    kids = tree.children()
    a = kids[(-1, 11)]  # the copy's first token is also a mask candidate: one node, continued by the copy
    assert tree.copied[a] and tree.values[a] == pytest.approx(0.6)
    b = kids[(a, 30)]
    assert kids[(b, 31)] > b and tree.copied[b]
    assert (a, 20) in kids and (kids[(-1, 10)], 20) in kids  # mask candidates grow under every parent
    assert len(grow_tree(dists, [11, 30, 31], budget=2, copy_share=(0.6, 0.4, 0.3))) == 2


def test_walk_follows_the_models_own_tokens():
    tree = depth_first(DraftTree([10, 20, 11, 21], [-1, 0, -1, 2], [0.6, 0.3, 0.3, 0.1], [0.6, 0.5, 0.3, 0.3],
                                 [False] * 4))
    # ar[0] follows the root, ar[i + 1] follows node i
    assert walk(tree, [11, 0, 0, 21, 5]) == [2, 3]  # root -> 11 -> 21 (off the top-1 chain)
    assert walk(tree, [10, 20, 7, 0, 0]) == [0, 1]
    assert walk(tree, [12, 0, 0, 0, 0]) == []


def test_group_anchors_pick_the_likeliest_ends():
    tree = grow_tree([([10, 11], [0.7, 0.2]), ([20], [0.5])], [], budget=3)
    # ends: root 1 - .9 = .1, 10: .7 - .35 = .35, 11: .2, 10>20: .35 (tie)
    assert group_anchors(tree, None) == [-1, 0, 1, 2]
    assert set(group_anchors(tree, 2)) == {tree.children()[(-1, 10)], tree.children()[(tree.children()[(-1, 10)], 20)]}


def test_top_candidates_are_probabilities_likeliest_first():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]))
    got = top_candidates(logits, 2)
    assert [t for t, _ in got] == [[1, 2], [0, 2]]
    assert got[0][1] == pytest.approx([0.6, 0.3]) and got[1][1] == pytest.approx([0.5, 0.3])


# ---- token for token against AR greedy


def ar_of(lm, ids, n):
    return [generate_ids(lm, [p], DecodeConfig(mode="ar", max_new_tokens=n))[0].token_ids for p in ids]


@pytest.mark.parametrize("arch,backend,nodes,groups,B", [
    ("llama", "hf", 1, "all", 4), ("qwen2", "fast", 1, "last", 4), ("llama", "fast", 3, "last:3", 4),
    ("qwen2", "hf", 8, "all", 3), ("llama", "fast", 16, "all", 4), ("qwen2", "fast", 16, "last:2", 4),
    ("llama", "hf", 64, "last", 2), ("qwen2", "hf", 64, "all", 4), ("llama", "fast", 64, "all", 4),
    # the GPU's fixed-shape path (mars.runtime.static), run on the CPU without graphs: a tree's width varies
    # pass by pass, so its buckets and padded columns are exercised too
    ("llama", "static", 8, "all", 4), ("qwen2", "static", 16, "last", 4)])
def test_tree_reproduces_ar_greedy_alone_batched_and_uncached(tiny_lm, tiny_qwen, arch, backend, nodes, groups, B):
    lm = tiny_lm if arch == "llama" else tiny_qwen
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS + REPEAT_PROMPTS[:1]]
    ar = ar_of(lm, ids, 40)
    groups, _, tree_groups = groups.partition(":")  # "last:3": groups on the 3 likeliest ends (default: by device)
    kw = dict(mode="verified", tree_nodes=nodes, verify_groups=groups, drafts="both", block_size=B, tau=0.0,
              max_new_tokens=40, backend=backend, tree_groups=int(tree_groups) if tree_groups else None)
    alone = [generate_ids(lm, [p], DecodeConfig(**kw, cache_block=8))[0] for p in ids]
    assert [r.token_ids for r in alone] == ar
    assert [r.token_ids for r in generate_ids(lm, ids, DecodeConfig(**kw, cache_block=5))] == ar
    assert [r.token_ids for r in generate_ids(lm, ids, DecodeConfig(**kw, use_cache=False))] == ar
    for r in alone:
        for s in r.steps:
            assert s.drafts_sent <= nodes and all(t in c for t, c in zip(s.tree_path, s.tree_depths))
            if not s.finish_reason:  # the path, then the model's own token (an EOS or a limit may cut it)
                assert s.tree_path == s.token_ids[:-1]


@pytest.mark.parametrize("tree_groups", [1, 2, 3])
def test_tree_groups_set_how_many_mask_groups_a_pass_carries(tiny_lm, tree_groups):
    """verify_groups "last" puts DecodeConfig.tree_groups mask groups (of B-1 masks) on the tree's likeliest
    ends, so a pass feeds its real tokens, the N nodes and that many groups; "all" one per node and the root."""
    from mars.decoding.modes import make_mode

    ids = encode_prompt(tiny_lm.tokenizer, PROMPTS[0])
    B, nodes = 3, 4
    kw = dict(mode="verified", tree_nodes=nodes, drafts="both", block_size=B, tau=0.0, max_new_tokens=24)
    cfg = DecodeConfig(**kw, verify_groups="last", tree_groups=tree_groups)
    mode = make_mode(cfg)
    seen = []
    real_plan = type(mode).plan

    def plan(self, row, cfg, tau):
        out = real_plan(self, row, cfg, tau)
        seen.append((len(out.to_verify), out.groups))
        return out

    type(mode).plan = plan
    try:
        run = generate_ids(tiny_lm, [ids], cfg)[0]
    finally:
        type(mode).plan = real_plan
    assert run.token_ids == ar_of(tiny_lm, [ids], 24)[0]
    full = [(n, g) for n, g in seen if n == nodes]  # passes with a whole tree (the first has no candidates yet)
    assert full and all(len(g) == tree_groups and all(k == B - 1 for _, k in g) for _, g in full)
    if tree_groups == 1:  # the default on a CPU model: None picks it by device (a GPU keeps 3)
        from mars.decoding.tree import default_tree_groups

        default = DecodeConfig(**kw, verify_groups="last")
        assert default.tree_groups is None and make_mode(default, tiny_lm).groups == 1
        assert default_tree_groups("cuda") == 3 and default_tree_groups("mps") == 1
    wide = [s.input_len for s in run.steps[1:] if s.drafts_sent == nodes]
    assert 1 + nodes + tree_groups * (B - 1) in wide  # the last token, the tree, the groups' masks
    with pytest.raises(ValueError, match="tree groups"):
        DecodeConfig(**kw, tree_groups=0)


@pytest.mark.parametrize("cache_block", [3, 8])
def test_paths_off_the_top1_chain_are_re_fed_and_stay_exact(tiny_lm, cache_block):
    """Oracle drafts that put the right token second at some depths: accepted paths leave the top-1 chain,
    whose KV the cache cannot keep in place; they are fed again as real tokens next pass, and the text stays
    AR's, alone and in a batch."""
    import mars.decoding.tree as tree_module

    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]
    ar = ar_of(tiny_lm, ids, 40)
    V = len(tiny_lm.tokenizer)
    off_chain = []

    class Oracle(tree_module.TreeMode):
        def plan(self, row, cfg, tau):
            k = len(row.generated)
            truth = ar[ids.index(row.tokens[:row.n_prompt])][k:k + 3]  # depth 1: what this pass's root predicts
            wrong = lambda t: (t + 1) % V  # noqa: E731
            self.dists[row.index] = [(([wrong(t), t] if (k + d) % 3 else [t, wrong(t)]), [0.6, 0.4])
                                     for d, t in enumerate(truth)]
            return super().plan(row, cfg, tau)

        def accept(self, row, plan, main, groups, cfg, tau, gen):
            out = super().accept(row, plan, main, groups, cfg, tau, gen)
            off_chain.append(out.n_verified < len(out.tree_path))
            return out

    cfg = DecodeConfig(mode="verified", tree_nodes=12, block_size=4, tau=0.0, max_new_tokens=40,
                       cache_block=cache_block)

    def oracle():  # a mode object per run, as the decoder makes its own (the mode= it is handed)
        return Oracle(cfg.tree_nodes, cfg.verify_groups, None, cfg.drafts, tree_module.default_tree_groups("cpu"),
                      None, V)

    alone = [generate_ids(tiny_lm, [p], cfg, mode=oracle())[0] for p in ids]
    assert [r.token_ids for r in alone] == ar
    assert sum(r.tokens for r in alone) / sum(r.passes for r in alone) > 2.5  # the oracle's paths were taken
    assert any(off_chain)
    assert [r.token_ids for r in generate_ids(tiny_lm, ids, cfg, mode=oracle())] == ar


def test_lookup_copies_enter_the_tree_on_repetitive_text(tiny_lm):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in REPEAT_PROMPTS]
    ar = ar_of(tiny_lm, ids, 40)
    runs = [generate_ids(tiny_lm, [p], DecodeConfig(mode="verified", tree_nodes=8, drafts="both", tau=0.0,
                                                    max_new_tokens=40))[0] for p in ids]
    assert [r.token_ids for r in runs] == ar
    sources = {s.draft_source for r in runs for s in r.steps}
    assert sources & {"lookup", "mars+lookup"}, sources
    only = generate_ids(tiny_lm, ids, DecodeConfig(mode="verified", tree_nodes=8, drafts="lookup", tau=0.0,
                                                   max_new_tokens=40))
    assert [r.token_ids for r in only] == ar


def test_more_nodes_accept_more_per_pass_and_tau_one_sends_none(tiny_lm):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]

    def tpp(**kw):
        runs = [generate_ids(tiny_lm, [p], DecodeConfig(mode="verified", max_new_tokens=40, **kw))[0] for p in ids]
        return sum(r.tokens for r in runs) / sum(r.passes for r in runs), runs

    chain, _ = tpp(tau=0.0, verify_groups="all")
    small, _ = tpp(tau=0.0, tree_nodes=1, verify_groups="all")
    big, _ = tpp(tau=0.0, tree_nodes=32, verify_groups="all")
    assert big > small and big > chain
    _, none = tpp(tau=1.0, tree_nodes=16)
    assert all(s.drafts_sent == 0 and len(s.token_ids) == 1 for r in none for s in r.steps)


def test_records_carry_the_tree_into_the_runs_json(tiny_lm):
    ids = encode_prompt(tiny_lm.tokenizer, PROMPTS[3])
    run = generate_ids(tiny_lm, [ids], DecodeConfig(mode="verified", tree_nodes=6, tau=0.0, max_new_tokens=20))[0]
    steps = run.to_dict()["steps"]
    assert all("tree_depths" in s and "tree_path" in s for s in steps)
    assert steps[0]["tree_depths"] == [] and steps[0]["drafts_sent"] == 0  # the first pass has no drafts yet
    assert any(s["tree_depths"] for s in steps[1:])
    chain = generate_ids(tiny_lm, [ids], DecodeConfig(mode="verified", tau=0.0, max_new_tokens=20))[0]
    assert "tree_depths" not in chain.to_dict()["steps"][1]


def test_tree_nodes_are_checked_once_in_the_config():
    from mars.decoding.decoder import MAX_TREE_NODES

    assert DecodeConfig(mode="verified", tree_nodes=8.0).tree_nodes == 8
    assert DecodeConfig(mode="verified", tree_nodes=None).tree_nodes == 0
    with pytest.raises(ValueError, match=f"tree nodes must be a whole number between 0 and {MAX_TREE_NODES}"):
        DecodeConfig(mode="verified", tree_nodes=-1)
    with pytest.raises(ValueError, match="tree nodes need mode 'verified'"):
        DecodeConfig(mode="mars", tree_nodes=4)
    assert default_tree_nodes("cuda") >= default_tree_nodes("cpu") >= 1 and default_tree_nodes("mps") >= 1


def test_cli_generate_takes_tree_nodes(tiny_dir, capsys):
    from mars.cli import main

    assert main(["generate", "tell me a word", "--model", str(tiny_dir), "--adapter", "none", "--mode", "verified",
                 "--tree-nodes", "auto", "--max-new-tokens", "8", "--json"]) == 0
    out = capsys.readouterr()
    import json

    row = json.loads(out.out.strip().splitlines()[-1])
    assert row["config"]["tree_nodes"] == default_tree_nodes("cpu")
    assert main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--tree-nodes", "8"]) == 2
    assert "tree nodes need mode 'verified'" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--mode", "verified",
                 "--tree-nodes", "many"]) == 2
    assert "--tree-nodes must be a whole number or 'auto'" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--mode", "verified",
                 "--datastore"]) == 2  # a datastore needs a tree and lookup drafts
    assert "datastore drafts need a tree" in capsys.readouterr().err
    assert main(["generate", "tell me a word", "--model", str(tiny_dir), "--adapter", "none", "--mode", "verified",
                 "--tree-nodes", "4", "--drafts", "both", "--datastore", "--max-new-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["config"]["datastore"] is True
    assert main(["generate", "tell me a word", "--model", str(tiny_dir), "--adapter", "none", "--mode", "verified",
                 "--tree-nodes", "4", "--tree-groups", "2", "--max-new-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["config"]["tree_groups"] == 2
    assert main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--mode", "verified",
                 "--tree-nodes", "4", "--tree-groups", "0"]) == 2
    assert "tree groups must be a whole number between 1" in capsys.readouterr().err


def test_bench_runs_one_tree_per_node_budget(tiny_lm):
    from mars.evaluation.bench import BenchConfig, format_table, run_bench

    cfg = BenchConfig(PROMPTS[:2], methods=("ar", "verified_tree", "verified_tree_last"), tree_nodes=(2, 8),
                      batch_sizes=(1, 2), max_new_tokens=12)
    runs = run_bench(tiny_lm, cfg)
    names = [(r.method, r.batch_size) for r in runs]
    for bs in (1, 2):
        for m in ("verified_tree:2", "verified_tree:8", "verified_tree_last:2", "verified_tree_last:8"):
            assert (m, bs) in names
    assert all(r.exact_match_with_ar == 1.0 for r in runs)
    assert "verified_tree_last:8" in format_table(runs)
    with pytest.raises(ValueError, match="tree nodes"):
        BenchConfig(PROMPTS, methods=("verified_tree",), tree_nodes=(0,))


DEFAULT_PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
                   "Rewrite this sentence in the passive voice: The committee approved the new budget."]


@pytest.mark.parametrize("nodes", [4, 16])
def test_default_model_tree_equals_ar(default_lm, nodes):
    ids = [encode_prompt(default_lm.tokenizer, p) for p in DEFAULT_PROMPTS]
    ar = ar_of(default_lm, ids, 24)
    cfg = DecodeConfig(mode="verified", tree_nodes=nodes, drafts="both", tau=0.0, max_new_tokens=24)
    assert [generate_ids(default_lm, [p], cfg)[0].token_ids for p in ids] == ar
    assert [r.token_ids for r in generate_ids(default_lm, ids, cfg)] == ar


def test_tree_passes_stream_like_any_other(tiny_lm):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS[:2]]
    cfg = DecodeConfig(mode="verified", tree_nodes=4, tau=0.0, max_new_tokens=10)
    seen = [rec for records in decode_steps(tiny_lm, ids, cfg) for rec in records]
    assert {r.row for r in seen} == {0, 1} and all(r.input_len >= 1 for r in seen)


def _grow_tree_slow(dists, copies, budget, tau=0.0, copy_share=()):
    """tree.grow_tree as first written: every child pushed when its parent enters (the obvious best-first)."""
    import heapq

    from mars.decoding.tree import DraftTree, _depth, depth_first

    tree, at, heap, seq = DraftTree(), {}, [], 0

    def push_masks(parent, depth, value):
        nonlocal seq
        if depth <= len(dists) and tau < 1.0:
            for t, p in zip(*dists[depth - 1]):
                if p < tau:
                    break
                heapq.heappush(heap, (-value * p, seq, parent, t, p, -1))
                seq += 1

    def push_copy(parent, k):
        nonlocal seq
        if k < len(copies):
            share = copy_share[k] if k < len(copy_share) else 0.0
            heapq.heappush(heap, (-share, seq, parent, copies[k], share, k))
            seq += 1

    push_masks(-1, 1, 1.0)
    push_copy(-1, 0)
    while heap and len(tree) < budget:
        neg, _, parent, t, p, k = heapq.heappop(heap)
        if (parent, t) in at:
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
    return depth_first(tree)


def test_grow_tree_pushing_siblings_lazily_grows_the_same_tree():
    """grow_tree against the push-everything version on random candidates: ties in value (probabilities from a
    few powers of two), repeated tokens across depths, copies merging with masks, tau, unsorted lists."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda n: int(torch.randint(n, (), generator=g))  # noqa: E731
    for trial in range(400):
        dists = []
        for _ in range(rnd(5)):
            k = 1 + rnd(6)
            probs = sorted((0.5 ** (1 + rnd(4)) for _ in range(k)), reverse=True)
            if trial % 7 == 0:
                probs = [probs[i] for i in torch.randperm(k, generator=g).tolist()]  # not likeliest first
            dists.append(([rnd(8) for _ in range(k)], probs))
        copies = [rnd(8) for _ in range(rnd(5))]
        share = [0.5 ** (1 + rnd(4)) for _ in range(rnd(6))]
        tau = [0.0, 0.1, 0.25, 1.0][rnd(4)]
        budget = 1 + rnd(20)
        got = grow_tree(dists, copies, budget, tau, share)
        want = _grow_tree_slow(dists, copies, budget, tau, share)
        assert (got.tokens, got.parents, got.values, got.probs, got.copied) == \
            (want.tokens, want.parents, want.values, want.probs, want.copied), trial


def test_datastore_chains_stay_exact_and_add_tokens_per_pass(tiny_lm, monkeypatch):
    """A datastore built from the model's own greedy answers (here: to the same prompts, the best case) feeds
    chains that the check accepts; one built from noise is rejected; the text is AR's either way, alone and
    batched."""
    from mars.decoding.datastore import Datastore

    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]
    ar = ar_of(tiny_lm, ids, 40)
    kw = dict(mode="verified", tree_nodes=4, drafts="both", tau=0.0, max_new_tokens=40, block_size=2,
              verify_groups="last")
    plain = [generate_ids(tiny_lm, [p], DecodeConfig(**kw))[0] for p in ids]
    runs = {}
    V = len(tiny_lm.tokenizer)
    for name, seqs in {"own": [p + a for p, a in zip(ids, ar)],
                       "noise": [[(7 * i + 3) % V for i in range(200)]]}.items():
        store = Datastore.from_sequences(seqs, min_count=1)  # each answer once: every suffix seen once
        monkeypatch.setattr(tiny_lm, "datastore", store, raising=False)
        runs[name] = [generate_ids(tiny_lm, [p], DecodeConfig(**kw, datastore=True))[0] for p in ids]
        assert [r.token_ids for r in runs[name]] == ar
        assert [r.token_ids for r in generate_ids(tiny_lm, ids, DecodeConfig(**kw, datastore=True))] == ar
    per_pass = {k: sum(r.tokens for r in v) / sum(r.passes for r in v) for k, v in runs.items()}
    base = sum(r.tokens for r in plain) / sum(r.passes for r in plain)
    assert per_pass["own"] > 2 * base, (per_pass, base)
    assert per_pass["noise"] <= base + 0.1
    assert any("store" in (s.draft_source or "") for r in runs["own"] for s in r.steps)
    with pytest.raises(ValueError, match="datastore"):
        DecodeConfig(mode="verified", drafts="both", datastore=True)  # no tree
