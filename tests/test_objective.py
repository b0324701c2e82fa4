"""The training mask, batch layout and loss; the model honours the 4D mask; training aligns with decoding."""

import pytest
import torch
import torch.nn.functional as F

from mars.decoding import DecodeConfig, decode_steps
from mars.objective import Example, build_batch, forward_batch, mars_attention_mask, mars_loss

# L=8, B=4: columns c0..c7 (clean) then n0..n7 (noisy); rows are queries in the same order.
HAND = """
c0 10000000 00000000
c1 11000000 00000000
c2 11100000 00000000
c3 11110000 00000000
c4 11111000 00000000
c5 11111100 00000000
c6 11111110 00000000
c7 11111111 00000000
n0 00000000 10000000
n1 00000000 11000000
n2 00000000 11100000
n3 00000000 11110000
n4 11110000 00001000
n5 11110000 00001100
n6 11110000 00001110
n7 11110000 00001111
"""


def hand_matrix():
    rows = [line.split()[1] + line.split()[2] for line in HAND.strip().splitlines()]
    return torch.tensor([[c == "1" for c in r] for r in rows])


def test_mask_equals_hand_written_matrix():
    assert torch.equal(mars_attention_mask(8, 4), hand_matrix())


def test_mask_with_noisy_start_is_the_full_mask_without_prompt_block_copies():
    full = hand_matrix()
    keep = list(range(8)) + list(range(12, 16))  # clean 0..7, noisy 4..7
    assert torch.equal(mars_attention_mask(8, 4, noisy_start=4), full[keep][:, keep])


def test_batch_layout_for_three_prompt_tokens():
    # prompt 3 tokens, response 5 (with EOS), L=8, B=4, mask id 99, pad 0
    ex = Example([11, 12, 13], [21, 22, 23, 24, 2])
    batch = build_batch([ex], 4, mask_token_id=99, pad_token_id=2, drop_prompt_noisy=False)
    assert batch.input_ids[0].tolist() == [11, 12, 13, 21, 22, 23, 24, 2, 11, 12, 13, 99, 99, 99, 99, 99]
    assert batch.position_ids[0].tolist() == list(range(8)) * 2
    assert torch.equal(batch.attention_mask[0, 0], hand_matrix())
    # right-shifted targets: position t scores token t+1, for response tokens only
    assert batch.clean_labels[0].tolist() == [-100, -100, 21, 22, 23, 24, 2, -100]
    assert batch.noisy_labels[0].tolist() == [-100, -100, 21, 22, 23, 24, 2, -100]


def test_batch_pads_finished_responses_with_eos_to_a_block_multiple_and_mixes_prompt_lengths():
    a = Example([5, 6, 7, 8, 9], [30, 31, 2])  # L = 8 exactly
    b = Example([5, 6], [40, 41, 42, 43, 44, 45, 46], finished=False)  # L = 9, unfinished: no EOS pad scored
    batch = build_batch([a, b], 4, mask_token_id=99, pad_token_id=2, drop_prompt_noisy=True)
    Lc = batch.clean_len
    assert Lc == 12
    # row a: noisy copy starts at block 1 (prompt 0..4 -> its block-0 noisy copy is dropped)
    assert batch.input_ids[0, Lc:Lc + 4].tolist() == [9, 99, 99, 99]
    assert batch.position_ids[0, Lc:Lc + 4].tolist() == [4, 5, 6, 7]
    # row b: 9 real tokens, scored targets end at the last real token
    assert batch.clean_labels[1].tolist()[:9] == [-100, 40, 41, 42, 43, 44, 45, 46, -100]
    assert batch.noisy_labels[1].tolist()[:9] == [-100, 40, 41, 42, 43, 44, 45, 46, -100]
    # no attention row is empty (padding queries see themselves)
    assert batch.attention_mask.any(-1).all()


def test_skip_last_slot_drops_distance_b_plus_one_targets():
    ex = Example([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 2])
    full = build_batch([ex], 4, 99, 2, drop_prompt_noisy=False)
    skip = build_batch([ex], 4, 99, 2, drop_prompt_noisy=False, skip_last_slot=True)
    dropped = [t for t in range(12) if full.noisy_labels[0, t] != -100 and skip.noisy_labels[0, t] == -100]
    assert dropped == [3, 7]  # the last slot of blocks 0 and 1


def _example(lm, n_prompt=5, n_resp=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = len(lm.tokenizer)
    ids = torch.randint(10, V, (n_prompt + n_resp,), generator=g).tolist()
    return Example(ids[:n_prompt], ids[n_prompt:])


def test_model_honours_the_4d_mask(tiny_lm):
    ex = _example(tiny_lm)
    batch = build_batch([ex], 4, tiny_lm.mask_token_id, 3, drop_prompt_noisy=False)
    Lc = batch.clean_len
    base = forward_batch(tiny_lm.model, batch)[0]
    changed = batch.input_ids.clone()
    changed[0, 6] = (changed[0, 6] + 1) % 200 + 10  # clean position 6 (block 1): hidden from noisy block 1
    batch.input_ids = changed
    after = forward_batch(tiny_lm.model, batch)[0]
    for q in range(Lc + 4, Lc + 8):  # noisy block 1 may only see clean block 0
        assert torch.equal(base[q], after[q])
    assert not torch.allclose(base[6], after[6])  # the clean query itself does change
    assert not torch.allclose(base[Lc + 8], after[Lc + 8])  # noisy block 2 sees clean block 1


def test_clean_copy_matches_a_plain_causal_forward(tiny_lm):
    ex = _example(tiny_lm)
    batch = build_batch([ex], 4, tiny_lm.mask_token_id, 3, drop_prompt_noisy=False)
    ids = torch.tensor([ex.prompt_ids + ex.response_ids])
    plain = tiny_lm.model(input_ids=ids).logits[0]
    mixed = forward_batch(tiny_lm.model, batch)[0, : ids.shape[1]]
    assert torch.allclose(plain, mixed, atol=1e-10)


def _teacher_forced_vs_decoder(lm, ex, block, B, atol):
    batch = build_batch([ex], B, lm.mask_token_id, lm.eos_token_ids[0], drop_prompt_noisy=False)
    Lc = batch.clean_len
    probs = torch.softmax(forward_batch(lm.model, batch)[0].float(), -1)
    start = block * B  # a block boundary inside the response
    seq = ex.prompt_ids + ex.response_ids
    cfg = DecodeConfig(mode="mars", block_size=B, tau=1.0, max_new_tokens=1, top_k=5)
    (record,) = next(decode_steps(lm, [seq[:start]], cfg))
    # proposal 0 = the clean last real token (AR); proposal j = noisy slot j-1 of the block
    expected = [probs[start - 1]] + [probs[Lc + start + j] for j in range(B - 1)]
    for cands, p in zip(record.candidates, expected):
        top = p.topk(5)
        assert [c[0] for c in cands] == top.indices.tolist()
        assert torch.allclose(torch.tensor([c[1] for c in cands], dtype=torch.float64), top.values.double(), atol=atol)


def test_training_and_inference_alignment_tiny(tiny_lm):
    for B in (2, 4):
        _teacher_forced_vs_decoder(tiny_lm, _example(tiny_lm, 5, 15), block=4 if B == 2 else 2, B=B, atol=1e-6)


def test_training_and_inference_alignment_default_model(default_lm):
    tok = default_lm.tokenizer
    from mars.decoding import encode_prompt

    prompt = encode_prompt(tok, "Name three rivers in Europe.")
    resp = tok(" The Danube, the Rhine and the Seine are three long rivers in Europe.", add_special_tokens=False)["input_ids"]
    ex = Example(prompt, resp + [2])
    B = 4
    block = len(prompt) // B + 2
    _teacher_forced_vs_decoder(default_lm, ex, block=block, B=B, atol=2e-4)


def test_loss_falls_when_overfitting_a_few_examples(tiny_lm):
    import copy

    model = copy.deepcopy(tiny_lm.model).float().train()
    exs = [_example(tiny_lm, 4, 9, seed=s) for s in range(3)]
    batch = build_batch(exs, 4, tiny_lm.mask_token_id, 3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    history = []
    for _ in range(40):
        losses = mars_loss(forward_batch(model, batch), batch)
        opt.zero_grad()
        losses["loss"].backward()
        opt.step()
        history.append({k: v.item() for k, v in losses.items()})
    assert history[-1]["noisy"] < 0.5 * history[0]["noisy"]
    assert history[-1]["clean"] < 0.5 * history[0]["clean"]


def test_distill_loss_is_zero_for_the_same_distribution_and_ignores_unscored_positions():
    from mars.objective import distill_loss

    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 5, 11, generator=g)
    labels = torch.tensor([[-100, 3, 4, -100, -100], [1, 2, -100, -100, -100]])
    assert distill_loss(t.clone(), t, labels).item() == pytest.approx(0.0, abs=1e-6)
    s = torch.randn(2, 5, 11, generator=g)
    kl = distill_loss(s, t, labels)
    keep = labels != -100
    want = (F.softmax(t[keep], -1) * (F.log_softmax(t[keep], -1) - F.log_softmax(s[keep], -1))).sum(-1).mean()
    assert kl.item() == pytest.approx(want.item(), rel=1e-5) and kl.item() > 0
    s2 = s.clone()
    s2[labels == -100] += 5.0  # unscored positions do not count
    assert distill_loss(s2, t, labels).item() == pytest.approx(kl.item(), rel=1e-6)


def test_clean_forward_equals_the_clean_half_of_the_two_copy_pass(tiny_lm):
    from mars.objective import build_batch, clean_forward, forward_batch

    ex = [Example([1, 5, 6, 7, 8], [9, 10, 11, 2]), Example([1, 5, 6], [12, 13, 2])]
    batch = build_batch(ex, 4, tiny_lm.mask_token_id, 2)
    with torch.no_grad():
        both = forward_batch(tiny_lm.model, batch)[:, : batch.clean_len]
        alone = clean_forward(tiny_lm.model, batch)
    assert torch.allclose(both, alone, atol=1e-9)
