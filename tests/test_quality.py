"""mean_nll against a token-by-token reference; prefix agreement by hand."""

from __future__ import annotations

import pytest
import torch

from mars.evaluation.quality import mean_nll, prefix_agreement
from tiny import make_loaded


def test_mean_nll_matches_one_token_at_a_time():
    lm = make_loaded()
    prompt = lm.tokenizer("the capital of france is", add_special_tokens=False)["input_ids"]
    tokens = lm.tokenizer("paris and the water", add_special_tokens=False)["input_ids"]
    total = 0.0
    with torch.inference_mode():
        for i, t in enumerate(tokens):  # slow, obvious path: one forward per scored token
            logits = lm.model(input_ids=torch.tensor([prompt + tokens[:i]])).logits[0, -1]
            total -= torch.log_softmax(logits.double(), -1)[t].item()
    assert mean_nll(lm, prompt, tokens) == pytest.approx(total / len(tokens), rel=1e-9)


def test_mean_nll_of_the_greedy_token_is_its_minus_log_prob():
    lm = make_loaded()
    prompt = lm.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logp = torch.log_softmax(lm.model(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1)
    best = int(logp.argmax())
    assert mean_nll(lm, prompt, [best]) == pytest.approx(-logp[best].item(), rel=1e-9)


def test_mean_nll_needs_tokens():
    lm = make_loaded()
    with pytest.raises(ValueError):
        mean_nll(lm, [5, 6], [])
    with pytest.raises(ValueError):
        mean_nll(lm, [], [5])


@pytest.mark.parametrize(
    "ref, cand, expected",
    [([1, 2, 3, 4], [1, 2, 3, 4], 1.0), ([1, 2, 3, 4], [1, 2, 9, 4], 0.5), ([1, 2], [1, 2, 3, 4], 0.5),
     ([1, 2, 3, 4], [9], 0.0), ([], [], 1.0)],
)
def test_prefix_agreement(ref, cand, expected):
    assert prefix_agreement(ref, cand) == expected


def test_stutters_are_the_repeats_the_reference_does_not_have():
    from mars.evaluation.quality import adjacent_repeats, stutter_rate, stutters

    assert adjacent_repeats("in europe europe , it".split()) == {("europe",): 1}
    assert adjacent_repeats("in south america south america .".split()) == {("south", "america"): 1}
    assert adjacent_repeats("a a a".split()) == {("a",): 2}  # not also a 2-gram ("a a", "a a")
    mars = "The largest river in Europe Europe, in South America South America. It is very very long."
    ar = "The largest river in Europe, in South America. It is very very long."
    s = stutters(mars, ar)
    assert s["extra"] == 2 and s["examples"] == ["europe", "south america"]  # "very very" is in both
    assert stutters(ar, ar)["extra"] == 0
    rate = stutter_rate([mars, ar], [ar, ar])
    assert rate["extra_repeats"] == 2 and rate["texts_with_stutter"] == 0.5
    assert rate["per_100_words"] == pytest.approx(100 * 2 / (len(mars.split()) + len(ar.split()) - 0))
    with pytest.raises(ValueError, match="one reference per text"):
        stutter_rate([mars], [])
