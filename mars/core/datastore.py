"""Datastore drafting: guess the next tokens from what this model wrote after the same words elsewhere.

Prompt lookup (mars.core.lookup) copies only from the current text. A small model's answers share a great
deal of phrasing across prompts ("Here are three ...", "In conclusion, ..."), so an n-gram table over its own
greedy answers to other prompts (the self-distillation sets in data/selfdistill/, never the held-out ones)
predicts the next tokens of a new answer too: retrieval drafting, as in REST (He et al., 2023), here as an
n-gram language model. The verified mode checks every draft, so the text stays exactly the model's greedy text;
the table only changes how many tokens a pass gets.

    Datastore.from_sequences(seqs) ; store.draft(tokens, k) -> (drafts, probs)

A draft chain extends greedily: after the text's last n tokens (n = ORDER down to 2, the longest suffix seen
at least MIN_COUNT times) the most frequent next token, its share of that suffix's continuations as its
probability; the chain stops at the first suffix unseen or below MIN_SHARE. One table per n, keyed by the n
tokens packed 16 bits each into one int (vocabularies up to 65536 tokens).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

ORDER = 4  # longest suffix: 4-grams already identify most formulaic phrases
MIN_COUNT = 2  # a suffix seen once predicts nothing reliable
MIN_SHARE = 0.3  # a continuation that is not clearly the usual one is not worth an input
DEFAULT_SOURCES = ("data/selfdistill/train.jsonl.gz", "data/selfdistill/magpie.jsonl.gz")


def _keys(seq: np.ndarray, n: int) -> np.ndarray:
    """Packed keys of every n-gram of seq that has a next token: key i covers seq[i:i+n]. uint64: four 16-bit
    ids fill all 64 bits, and .tolist() gives the same Python ints that `_pack` does."""
    k = np.zeros(len(seq) - n, dtype=np.uint64)
    for j in range(n):
        k = (k << np.uint64(16)) | seq[j:len(seq) - n + j].astype(np.uint64)
    return k


def _pack(tokens) -> int:
    k = 0
    for t in tokens:
        k = (k << 16) | t
    return k


class Datastore:
    def __init__(self, tables: dict[int, dict[int, tuple[int, float]]]):
        self.tables = tables  # n -> {packed n-token suffix: (the most frequent next token, its share)}

    def __len__(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def get(self, suffix) -> tuple[int, float] | None:
        """(next token, share) after exactly this suffix (2..ORDER tokens), or None."""
        table = self.tables.get(len(suffix))
        return None if table is None else table.get(_pack(suffix))

    @classmethod
    def from_sequences(cls, seqs, order: int = ORDER, min_count: int = MIN_COUNT,
                       min_share: float = MIN_SHARE) -> "Datastore":
        tables: dict[int, dict[int, tuple[int, float]]] = {}
        seqs = [np.asarray(s, dtype=np.int64) for s in seqs if len(s) > 1]
        if seqs and max(int(s.max()) for s in seqs) >= 1 << 16:
            raise ValueError("datastore keys pack 16 bits per token: vocabularies up to 65536")
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
            share = pair_count[key_start] / total
            keep = (total >= min_count) & (share >= min_share)
            tables[n] = dict(zip(pk[key_start][keep].tolist(),
                                 zip(pn[key_start][keep].tolist(), share[keep].tolist())))
        return cls(tables)

    @classmethod
    def from_files(cls, paths=DEFAULT_SOURCES, root: Path | None = None) -> "Datastore":
        """From self-distillation files (JSON lines, gzipped or not, each with `response_ids`)."""
        seqs = []
        for p in paths:
            p = Path(root or ".") / p
            with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
                seqs += [json.loads(line)["response_ids"] for line in f if line.strip()]
        return cls.from_sequences(seqs)

    def next_token(self, tokens: list[int]) -> tuple[int, float] | None:
        for n in range(min(ORDER, len(tokens)), 1, -1):
            table = self.tables.get(n)
            hit = None if table is None else table.get(_pack(tokens[-n:]))
            if hit is not None:
                return hit
        return None

    def draft(self, tokens: list[int], k: int, vocab: int | None = None) -> tuple[list[int], list[float]]:
        """Up to k draft tokens after `tokens`, and each one's share given the ones before it; the chain
        stops before a token id >= vocab (a table built for another tokenizer)."""
        ctx = list(tokens[-ORDER:])
        out, probs = [], []
        for _ in range(k):
            hit = self.next_token(ctx)
            if hit is None or (vocab is not None and hit[0] >= vocab):
                break
            out.append(hit[0]), probs.append(hit[1])
            ctx = ctx[1:] + [hit[0]] if len(ctx) >= ORDER else ctx + [hit[0]]
        return out, probs


# measured (the held-out prompts' float32 greedy answers, data/selfdistill/heldout.jsonl.gz, 1.8
# drafts per position): a chain's k-th draft is accepted with chance ~0.8 x the product of its shares, less
# at low products (product 0.9+: 0.77; 0.5: 0.29; 0.2: 0.13; 0.1: 0.07)
def store_values(probs: list[float]) -> list[float]:
    """The chance that each draft of a chain is accepted (the tree's path values), from its shares."""
    out, v = [], 1.0
    for p in probs:
        v *= p
        out.append(max(0.0, 0.9 * v - 0.1))
    return out


_DEFAULT: Datastore | None = None


def default_store() -> Datastore:
    """The table over the shipped self-distillation sets, built once per process (~1 s)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Datastore.from_files(root=Path(__file__).resolve().parents[2])
    return _DEFAULT
