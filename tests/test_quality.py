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
