"""Every mask against a matrix written by hand (the training mask's own test is in test_objective.py), and
the cache state's commit rule on a stub backend."""

import torch

import tiny
from mars.decoding.cache import BlockCache
from mars.decoding.masks import pass_mask, window_mask
from mars.runtime.attention import additive_mask
from mars.runtime.backends import make_backend


def rows(*lines: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line] for line in lines])


def test_window_mask_equals_hand_written_matrix():
    # [pad | r1 r2 | e0 e1 | group (0, 2): m m | group (2, 1): m]
    got = window_mask(n_pad=1, n_real=2, n_extra=2, groups=[(0, 2), (2, 1)])
    want = rows(
        "00000000",  # padding: no key (pass_mask lets it see itself)
        "01000000",  # r1
        "01100000",  # r2
        "01110000",  # e0: an extra is an ordinary causal input
        "01111000",  # e1
        "01100100",  # group 0 sees the real tokens only, then causal inside the group
        "01100110",
        "01111001",  # group 2 sees the real tokens and both extras, and itself
    )
    assert torch.equal(got, want)


def test_mars_window_is_a_causal_block_of_masks_behind_the_real_tokens():
    # batch 1, MARS at B = 4: the last real token then B - 1 masks, as a noisy block in training
    got = window_mask(0, 2, 0, [(0, 3)])
    assert torch.equal(got, rows("10000", "11000", "11100", "11110", "11111"))


def test_pass_mask_puts_cached_keys_first_and_lets_every_query_see_itself():
    cached = torch.tensor([[False, True], [True, True]])  # row 0 has one column of left padding
    local = torch.zeros(2, 2, 2, dtype=torch.bool)
    local[0] = rows("10", "00")  # one real input, then right padding
    local[1] = rows("10", "11")
    got = pass_mask(cached, local)
    assert torch.equal(got[0], rows("0110", "0101"))
    assert torch.equal(got[1], rows("1110", "1111"))


def test_additive_mask():
    m = additive_mask(rows("10", "11"), torch.float32)
    assert m.dtype == torch.float32 and m[0, 0] == 0 and m[1, 1] == 0
    assert m[0, 1] == torch.finfo(torch.float32).min


class _StubRunner:
    def __init__(self):
        self.calls = []

    def truncate(self, n):
        self.calls.append(("truncate", n))

    def select(self, rows):
        self.calls.append(("select", rows))


def _cache(use_cache=True):
    lm = tiny.make_loaded("llama", seed=8)
    runner = make_backend(lm.model, "hf", 2, 32, use_cache)
    cache = BlockCache(runner, prompt_len=5, rows=2, cache_block=4, use_cache=use_cache)
    cache.runner = _StubRunner()
    return cache


def test_cache_commits_what_each_row_computed_from_real_inputs():
    cache = _cache()
    assert cache.next_block([5, 5]) == 9 and cache.next_block([9, 12]) == 13  # moves once every row is there
    # a prompt pass: row 1's 3-token prompt right-aligned after 2 columns of padding, 4 and 2 tokens kept
    assert cache.commit(starts=[0, 2], counts=[4, 2]) == [4, 2]
    assert cache.length == 4 and cache.runner.calls == [("truncate", 4)]
    assert cache.key_ok.tolist() == [[True] * 4, [False, False, True, True]]  # padding is never a key
    # row 0 keeps 1 token, row 1 (window right-aligned at column 1 of the pass) keeps 3: the cache grows by 4,
    # and row 0's other 3 columns are holes
    assert cache.commit(starts=[0, 1], counts=[1, 3]) == [1, 3]
    assert cache.length == 8 and cache.runner.calls[-1] == ("truncate", 8)
    assert cache.key_ok[:, 4:].tolist() == [[True, False, False, False], [False, True, True, True]]
    cache.commit(starts=[3, 0], counts=[0, 0])  # nothing kept: the pass's columns all dropped
    assert cache.length == 8
    cache.select([1])
    assert cache.key_ok.tolist() == [[False, False, True, True, False, True, True, True]]
    assert cache.runner.calls[-1] == ("select", [1])


def test_uncached_runs_commit_nothing():
    cache = _cache(use_cache=False)
    assert cache.commit(starts=[0, 2], counts=[4, 2]) == [0, 0]
    assert cache.length == 0 and cache.runner.calls == [("truncate", 0)]


def _window_mask_slow(n_pad, n_real, n_extra, groups, parents=None):
    """The obvious window mask, element by element from the rules in masks.window_mask's docstring."""
    parents = list(range(-1, n_extra - 1)) if parents is None else parents
    anc = []  # anc[i]: extra i and its ancestors
    for i, p in enumerate(parents):
        anc.append({i} | (anc[p] if p >= 0 else set()))
    kinds = [("pad", 0)] * n_pad + [("real", 0)] * n_real + [("extra", i) for i in range(n_extra)]
    for gi, (j, m) in enumerate(groups):
        kinds += [("mask", (gi, j))] * m
    size = len(kinds)
    out = torch.zeros(size, size, dtype=torch.bool)
    for q, (kq, vq) in enumerate(kinds):
        for k, (kk, vk) in enumerate(kinds):
            if kk == "real":
                ok = kq != "pad" and (kq != "real" or k <= q)
            elif kk == "extra":
                ok = (kq == "extra" and vk in anc[vq]) or (kq == "mask" and vq[1] > 0 and vk in anc[vq[1] - 1])
            elif kk == "mask":
                ok = kq == "mask" and vq[0] == vk[0] and k <= q
            else:
                ok = False
            out[q, k] = ok
    return out


def test_window_mask_equals_the_element_by_element_rules_on_random_shapes():
    """The whole-tensor, cached window mask against the rules applied element by element: chains, trees, groups
    anywhere, padding, empty groups; twice each (the second comes from the cache, and is a fresh tensor)."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda n: int(torch.randint(n, (), generator=g))  # noqa: E731
    for _ in range(200):
        n_pad, n_real, n_extra = rnd(3), 1 + rnd(4), rnd(9)
        parents = None if rnd(2) else [rnd(i + 1) - 1 for i in range(n_extra)]
        groups = [(rnd(n_extra + 1), rnd(4)) for _ in range(rnd(4))]
        want = _window_mask_slow(n_pad, n_real, n_extra, groups, parents)
        first = window_mask(n_pad, n_real, n_extra, groups, parents)
        assert torch.equal(first, want), (n_pad, n_real, n_extra, groups, parents)
        first.fill_(True)  # a caller writing to its mask does not touch the cached one
        assert torch.equal(window_mask(n_pad, n_real, n_extra, groups, parents), want)
