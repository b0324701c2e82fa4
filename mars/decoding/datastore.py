"""Datastore drafting: guess the next tokens from what this model wrote after the same words elsewhere.

Prompt lookup (mars.decoding.lookup) copies only from the current text. A small model's answers share a great
deal of phrasing across prompts ("Here are three ...", "In conclusion, ..."), so an n-gram table over its own
greedy answers to other prompts (the self-distillation sets in data/selfdistill/, never the held-out ones)
predicts the next tokens of a new answer too: retrieval drafting, as in REST (He et al., 2023), here as an
n-gram language model. The verified mode checks every draft, so the text stays exactly the model's greedy text;
the table only changes how many tokens a pass gets.

    Datastore.from_sequences(seqs) ; store.draft(tokens, k) -> (drafts, probs)

A draft chain extends greedily: after the text's last n tokens (n = ORDER down to 2, the longest suffix seen
at least MIN_COUNT times) the most frequent next token, its discounted share of that suffix's continuations as
its probability; the chain stops at the first suffix unseen or below MIN_SHARE.
"""

from __future__ import annotations

import numpy as np

ORDER = 6  # longest suffix: longer ones are rarer but, where seen, a phrase the model repeats
MIN_COUNT = 1  # a suffix seen once still predicts (its share is discounted: see below)
MIN_SHARE = 0.3  # a continuation that is not clearly the usual one is not worth an input
_MUL = 0x9E3779B97F4A7C15  # an odd 64-bit multiplier: keys are a polynomial hash of (n, tokens) mod 2**64
_MASK = (1 << 64) - 1


def _keys(seq: np.ndarray, n: int) -> np.ndarray:
    """The hash of every n-gram of seq that has a next token (key i covers seq[i:i+n]), as `_hash` computes it:
    uint64 arithmetic wraps mod 2**64 as the Python version masks."""
    k = np.full(len(seq) - n, n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            k = k * np.uint64(_MUL) + seq[j:len(seq) - n + j].astype(np.uint64) + np.uint64(1)
    return k


def _hash(tokens) -> int:
    k = len(tokens)
    for t in tokens:
        k = (k * _MUL + t + 1) & _MASK
    return k


class Datastore:
    """Sorted hashed suffixes of every order with their likeliest next token and its share, in numpy arrays
    (millions of entries: a Python dict of them would take ~10x the memory). A hash collision can only make a
    draft wrong, which the check rejects."""

    def __init__(self, keys: np.ndarray, tokens: np.ndarray, shares: np.ndarray, order: int = ORDER):
        self.keys, self.tokens, self.shares, self.order = keys, tokens, shares, order

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, suffix) -> tuple[int, float] | None:
        """(next token, share) after exactly this suffix (2..order tokens), or None."""
        if not 2 <= len(suffix) <= self.order:
            return None
        h = np.uint64(_hash(suffix))
        i = int(self.keys.searchsorted(h))
        if i < len(self.keys) and self.keys[i] == h:
            return int(self.tokens[i]), float(self.shares[i])
        return None

    @classmethod
    def from_sequences(cls, seqs, order: int = ORDER, min_count: int = MIN_COUNT,
                       min_share: float = MIN_SHARE) -> "Datastore":
        """Per suffix of 2..order tokens: the most frequent next token (ties: the smaller id) and its share
        m / (total + 1), discounted so that a suffix seen once (share 1/2) ranks below one seen 10 times out of
        10 (10/11); kept when total >= min_count and m / total >= min_share."""
        seqs = [np.asarray(s, dtype=np.int64) for s in seqs if len(s) > 1]
        parts = []
        for n in range(2, order + 1):
            keys = np.concatenate([_keys(s, n) for s in seqs if len(s) > n] or [np.zeros(0, np.uint64)])
            nxt = np.concatenate([s[n:] for s in seqs if len(s) > n] or [np.zeros(0, np.int64)])
            if not len(keys):
                continue
            # count (key, next) pairs, then per key the largest count and the total
            order_ = np.lexsort((nxt, keys))
            keys, nxt = keys[order_], nxt[order_]
            pair_start = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (nxt[1:] != nxt[:-1])])
            pair_count = np.diff(np.r_[pair_start, len(keys)])
            pk, pn = keys[pair_start], nxt[pair_start]
            # per key, its pairs by count, largest first (lexsort is stable: ties keep the smaller token id)
            by_count = np.lexsort((-pair_count, pk))
            pk, pn, pair_count = pk[by_count], pn[by_count], pair_count[by_count]
            key_start = np.flatnonzero(np.r_[True, pk[1:] != pk[:-1]])
            total = np.add.reduceat(pair_count, key_start)
            best = pair_count[key_start]
            keep = (total >= min_count) & (best >= min_share * total)
            parts.append((pk[key_start][keep], pn[key_start][keep], (best / (total + 1))[keep]))
        if not parts:
            return cls(np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.float32), order)
        keys, toks, shares = (np.concatenate(x) for x in zip(*parts))
        at = np.argsort(keys, kind="stable")
        return cls(keys[at], toks[at].astype(np.int32), shares[at].astype(np.float32), order)


    def next_token(self, tokens: list[int]) -> tuple[int, float] | None:
        """After the longest suffix of tokens (up to `order`) that the table knows."""
        for n in range(min(self.order, len(tokens)), 1, -1):
            hit = self.get(tokens[-n:])
            if hit is not None:
                return hit
        return None

    def draft(self, tokens: list[int], k: int, vocab: int | None = None) -> tuple[list[int], list[float]]:
        """Up to k draft tokens after `tokens`, and each one's share given the ones before it; the chain
        stops before a token id >= vocab (a table built for another tokenizer)."""
        ctx = list(tokens[-self.order:])
        out, probs = [], []
        for _ in range(k):
            hit = self.next_token(ctx)
            if hit is None or (vocab is not None and hit[0] >= vocab):
                break
            out.append(hit[0]), probs.append(hit[1])
            ctx = (ctx + [hit[0]])[-self.order:]
        return out, probs


# Measured (the held-out prompts' float32 greedy answers, data/selfdistill/heldout.jsonl.gz, 12,800 positions,
# chains of up to 4, 2.8 drafts and 0.81 accepted per position): with the discounted shares a chain's k-th draft
# is accepted about as often as the product of its shares says (product 0.05: 8%, 0.25: 25%, 0.55: 48%,
# 0.75: 64%, 0.95: 96%), so the product is the tree's path value as it stands.
def store_values(probs: list[float]) -> list[float]:
    """The chance that each draft of a chain is accepted (the tree's path values), from its shares."""
    out, v = [], 1.0
    for p in probs:
        v *= p
        out.append(v)
    return out
