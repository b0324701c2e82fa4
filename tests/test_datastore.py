"""The datastore's n-gram table against a slow, obvious count; its chains; and the tree staying exact with it."""

import collections
import random

import pytest

from mars.decoding.datastore import MIN_COUNT, MIN_SHARE, ORDER, Datastore, store_values


def slow_table(seqs, order=ORDER, min_count=MIN_COUNT, min_share=MIN_SHARE):
    """suffix tuple -> (most frequent next token, smaller id on ties; its share), by counting."""
    counts = collections.defaultdict(collections.Counter)
    for s in seqs:
        for i in range(len(s)):
            for n in range(2, order + 1):
                if i - n >= 0:
                    counts[tuple(s[i - n:i])][s[i]] += 1
    out = {}
    for key, c in counts.items():
        total = sum(c.values())
        best = max(c.values())
        tok = min(t for t, m in c.items() if m == best)
        if total >= min_count and best / total >= min_share:
            out[key] = (tok, best / (total + 1))
    return out


@pytest.mark.parametrize("min_count", [1, 2])
def test_table_equals_a_slow_count_on_random_text(min_count):
    rng = random.Random(0)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(0, 60))] for _ in range(40)]
    seqs.append([65535, 0, 65535, 0, 65535, 7])  # the largest 16-bit id; vocabularies may be larger
    seqs.append([70000, 1, 70000, 1])
    store = Datastore.from_sequences(seqs, min_count=min_count)
    slow = slow_table(seqs, min_count=min_count)
    assert len(store) == len(slow) > 50
    for key, (tok, share) in slow.items():
        got = store.get(key)
        assert got[0] == tok and got[1] == pytest.approx(share)
    assert store.get((9, 9)) is None and store.get((0,)) is None


def test_chains_follow_the_usual_continuation_and_stop_where_unseen():
    seqs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7]]
    store = Datastore.from_sequences(seqs)
    drafts, probs = store.draft([8, 1, 2, 3], 5)
    assert drafts == [4, 5, 6]  # (1, 2, 3) -> 4 (3 of 3); (1, 2, 3, 4) -> 5 (2 of 3); -> 6 (2 of 2); then unseen
    assert probs == pytest.approx([3 / 4, 2 / 4, 2 / 3])
    assert store.draft([8, 1, 2, 3], 2)[0] == [4, 5]
    assert store.draft([8, 1, 2, 3], 5, vocab=5)[0] == [4]  # ids past the model's vocabulary are never drafted
    assert store.draft([7, 7], 3) == ([], [])
    assert store.draft([], 3) == ([], [])
    assert len(Datastore.from_sequences([])) == 0 and Datastore.from_sequences([[1]]).draft([1], 2) == ([], [])


def test_store_values_fall_along_a_chain():
    v = store_values([1.0, 0.5, 0.9])
    assert v[0] > v[1] > v[2] >= 0.0


def test_the_shipped_store_predicts_the_models_held_out_answers():
    """Built from the self-distillation sets (never the held-out prompts), its first draft matches the held-out
    answers' next token far more often than chance: what makes it worth an input."""
    import gzip
    import json
    from pathlib import Path

    from mars.models.datastore import shipped_store

    store = shipped_store()
    root = Path(__file__).resolve().parents[1]
    held = [json.loads(line) for line in gzip.open(root / "data/selfdistill/heldout.jsonl.gz", "rt")][:20]
    drafted = right = 0
    for r in held:
        seq = r["prompt_ids"] + r["response_ids"]
        for i in range(len(r["prompt_ids"]), len(seq)):
            d, _ = store.draft(seq[:i], 1)
            if d:
                drafted += 1
                right += d[0] == seq[i]
    assert drafted > 0.5 * sum(len(r["response_ids"]) for r in held)
    assert right / drafted > 0.3


def test_missing_or_corrupt_files_turn_the_datastore_off_not_the_app(tmp_path):
    import warnings

    from mars.models.datastore import read_store, shipped_store

    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(OSError):
        read_store([bad])
    with pytest.raises(FileNotFoundError):
        read_store([tmp_path / "absent.jsonl"])
    with pytest.warns(UserWarning, match="datastore drafts off"):
        assert shipped_store(("absent.jsonl",), tmp_path) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning, no second try
        assert shipped_store(("absent.jsonl",), tmp_path) is None


def test_app_uses_the_datastore_for_the_default_model_only(tiny_lm, monkeypatch, env):
    from dataclasses import replace

    from mars.app.inputs import fit_to_model, make_config

    cfg = make_config("verified", 0.0, 2, 16, tree_nodes=4)
    assert fit_to_model(tiny_lm, cfg)[0].datastore is False  # the tiny model: not the table's tokenizer
    monkeypatch.setattr(tiny_lm, "name", "smollm2")
    monkeypatch.setattr(tiny_lm, "datastore", None)  # the table it is handed is this test's only
    assert fit_to_model(tiny_lm, cfg)[0].datastore is True
    assert fit_to_model(tiny_lm, replace(cfg, tree_nodes=0))[0].datastore is False  # the chain: no tree
    env.set("MARS_DATASTORE", "0")
    assert fit_to_model(tiny_lm, cfg)[0].datastore is False
