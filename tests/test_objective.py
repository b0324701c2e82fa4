"""The training mask, batch layout and loss; the model honours the 4D mask; training aligns with decoding."""

import pytest
import torch
import torch.nn.functional as F

from mars.decoding.decoder import DecodeConfig, decode_steps
from mars.decoding.masks import mars_attention_mask
from mars.training.objective import Example, build_batch, forward_batch, mars_loss

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
    from mars.decoding.decoder import encode_prompt

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
    from mars.training.objective import distill_loss

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
    from mars.training.objective import build_batch, clean_forward, forward_batch

    ex = [Example([1, 5, 6, 7, 8], [9, 10, 11, 2]), Example([1, 5, 6], [12, 13, 2])]
    batch = build_batch(ex, 4, tiny_lm.mask_token_id, 2)
    with torch.no_grad():
        both = forward_batch(tiny_lm.model, batch)[:, : batch.clean_len]
        alone = clean_forward(tiny_lm.model, batch)
    assert torch.allclose(both, alone, atol=1e-9)


# ---- issue 13 items 2-3 and issue 14 item 7: loss weighting, prompt edge, truncation, shifted grids ----

def _noisy_pairs(batch, row=0):
    """{(position, target)} of a row's scored noisy outputs."""
    Lc = batch.clean_len
    lab = batch.noisy_labels[row]
    pos = batch.position_ids[row, Lc:]
    return sorted((int(pos[j]), int(lab[j])) for j in range(len(lab)) if lab[j] != -100)


def test_prompt_length_multiple_of_b_keeps_the_first_response_noisy_target():
    ex = Example([11, 12, 13, 14], [21, 22, 23, 2])  # p = 4 = B
    dropped = build_batch([ex], 4, 99, 2, drop_prompt_noisy=True)
    kept = build_batch([ex], 4, 99, 2, drop_prompt_noisy=False)
    assert _noisy_pairs(dropped) == _noisy_pairs(kept) == [(3, 21), (4, 22), (5, 23), (6, 2)]
    assert (dropped.clean_labels[0] != -100).sum() == 4


def test_dropping_prompt_blocks_never_loses_a_noisy_target():
    for B in (1, 2, 3, 4, 5):
        for p in range(1, 11):
            for offs in ([0], [B - 1], list(range(B))):
                ex = Example(list(range(10, 10 + p)), [40, 41, 42, 43, 44, 2])
                for skip in (False, True):
                    a = build_batch([ex], B, 99, 2, drop_prompt_noisy=True, skip_last_slot=skip, offsets=[offs])
                    b = build_batch([ex], B, 99, 2, drop_prompt_noisy=False, skip_last_slot=skip, offsets=[offs])
                    assert _noisy_pairs(a) == _noisy_pairs(b), (B, p, offs, skip)


def test_a_response_cut_by_max_length_gets_no_eos_target():
    ex = Example([11, 12, 13], [21, 22, 23, 24, 25, 2])  # finished, 9 tokens
    cut = build_batch([ex], 4, 99, 2, max_length=6)
    assert cut.clean_labels[0].tolist() == [-100, -100, 21, 22, 23, -100, -100, -100]  # no EOS or pad after 23
    assert 2 not in cut.noisy_labels[0].tolist()
    whole = build_batch([ex], 4, 99, 2, max_length=9)  # fits exactly: still finished, EOS and pads scored
    assert whole.clean_labels[0].tolist()[2:11] == [21, 22, 23, 24, 25, 2, 2, 2, 2]


def test_per_sequence_loss_weighting():
    g = torch.Generator().manual_seed(0)
    a = Example([5, 6, 7], [30, 31, 2])
    b = Example([5, 6], [40, 41, 42, 43, 44, 45, 46, 47, 48, 2])
    batch = build_batch([a, b], 4, 99, 2)
    logits = torch.randn(2, batch.input_ids.shape[1], 60, generator=g, dtype=torch.float64)
    tok = mars_loss(logits, batch)
    seq = mars_loss(logits, batch, per_sequence=True)

    def want(lg, lab, per_seq):
        ce = F.cross_entropy(lg.reshape(-1, 60), lab.reshape(-1), ignore_index=-100, reduction="none").view(lab.shape)
        k = lab != -100
        if per_seq:
            return ((ce * k).sum(1) / k.sum(1)).mean()
        return ce[k].mean()

    Lc = batch.clean_len
    for per_seq, got in ((False, tok), (True, seq)):
        assert got["clean"].item() == pytest.approx(want(logits[:, :Lc], batch.clean_labels, per_seq).item(), rel=1e-6)
        assert got["noisy"].item() == pytest.approx(want(logits[:, Lc:], batch.noisy_labels, per_seq).item(), rel=1e-6)
    assert abs(tok["clean"].item() - seq["clean"].item()) > 1e-4  # unequal lengths: the weightings differ


HAND_TWO_COPIES = """
c0 10000 00000 00000
c1 11000 00000 00000
c2 11100 00000 00000
c3 11110 00000 00000
c4 11111 00000 00000
a0 00000 10000 00000
a1 00000 11000 00000
a2 11000 00100 00000
a3 11000 00110 00000
a4 11110 00001 00000
b0 00000 00000 10000
b1 10000 00000 01000
b2 10000 00000 01100
b3 11100 00000 00010
b4 11100 00000 00011
"""


def test_two_noisy_copies_mask_equals_hand_written_matrix():
    from mars.decoding.masks import multi_copy_mask

    # L=5, B=2: copy a on the grid {0,1}{2,3}{4}, copy b shifted by 1: {0}{1,2}{3,4}
    rows = ["".join(line.split()[1:]) for line in HAND_TWO_COPIES.strip().splitlines()]
    hand = torch.tensor([[c == "1" for c in r] for r in rows])
    assert torch.equal(multi_copy_mask(5, 2, [(0, 5, 0), (0, 5, 1)]), hand)
    # one copy with offset 0 is the plain mask; start must be a boundary of its own grid
    assert torch.equal(mars_attention_mask(8, 4, 4, offset=0), multi_copy_mask(8, 4, [(4, 8, 0)]))
    with pytest.raises(ValueError):
        multi_copy_mask(8, 4, [(4, 8, 1)])
    multi_copy_mask(8, 4, [(5, 8, 1)])


def test_batch_layout_with_two_shifted_copies():
    ex = Example([11, 12, 13], [21, 22, 23, 2])  # L = 7
    batch = build_batch([ex], 2, 99, 2, drop_prompt_noisy=False, offsets=[[0, 1]])
    Lc = batch.clean_len
    assert Lc == 8  # padded to the end of grid 0's last block (8); grid 1 ends at 7
    assert batch.input_ids[0, :Lc].tolist() == [11, 12, 13, 21, 22, 23, 2, 2]
    assert batch.input_ids[0, Lc:].tolist() == [11, 12, 13] + [99] * 5 + [11, 12, 13] + [99] * 4
    assert batch.position_ids[0, Lc:].tolist() == list(range(8)) + list(range(7))
    assert batch.clean_labels[0].tolist() == [-100, -100, 21, 22, 23, 2, 2, -100]
    assert batch.noisy_labels[0].tolist() == [-100, -100, 21, 22, 23, 2, 2, -100] + [-100, -100, 21, 22, 23, 2, -100]
    from mars.decoding.masks import multi_copy_mask

    assert torch.equal(batch.attention_mask[0, 0], multi_copy_mask(8, 2, [(0, 8, 0), (0, 7, 1)]))


def test_draw_offsets():
    from mars.training.objective import draw_offsets

    seen = set()
    for i in range(40):
        o = draw_offsets(0, 0, i, 4, 1)
        assert o == draw_offsets(0, 0, i, 4, 1) and 0 <= o[0] < 4
        seen.add(o[0])
        two = draw_offsets(0, 1, i, 4, 3, shift=False)
        assert two[0] == 0 and len(set(two)) == 3 and all(0 <= x < 4 for x in two)
    assert seen == {0, 1, 2, 3}
    assert [draw_offsets(0, e, 5, 8, 1) for e in range(6)] != [draw_offsets(0, 0, 5, 8, 1)] * 6  # epochs differ
    with pytest.raises(ValueError):
        draw_offsets(0, 0, 0, 4, 5)


def test_each_noisy_copy_is_its_own_single_copy_forward_and_aligns_with_decoding(tiny_lm):
    from mars.training.objective import noisy_start

    lm = tiny_lm
    ex = _example(lm, 5, 15)  # L = 20, finished
    B, L = 4, 20
    both = build_batch([ex], B, lm.mask_token_id, 3, drop_prompt_noisy=True, offsets=[[1, 3]])
    lb = forward_batch(lm.model, both)[0]
    at = both.clean_len
    seq = ex.prompt_ids + ex.response_ids
    for o in (1, 3):
        s, e = noisy_start(5, B, o), L + (o - L) % B
        one = build_batch([ex], B, lm.mask_token_id, 3, drop_prompt_noisy=True, offsets=[[o]])
        lo = forward_batch(lm.model, one)[0]
        Lc1 = one.clean_len
        assert both.position_ids[0, at:at + e - s].tolist() == list(range(s, e))
        assert torch.allclose(lb[at:at + e - s], lo[Lc1:Lc1 + e - s], atol=1e-10)  # the copies do not see each other
        at += e - s
        # a block of this grid inside the response gives what the decoder proposes after the same prefix
        start = o + 2 * B
        assert start > 5
        probs = torch.softmax(lo.float(), -1)
        cfg = DecodeConfig(mode="mars", block_size=B, tau=1.0, max_new_tokens=1, top_k=3)
        (record,) = next(decode_steps(lm, [seq[:start]], cfg))
        expected = [probs[start - 1]] + [probs[Lc1 + start - s + j] for j in range(B - 1)]
        for cands, p in zip(record.candidates, expected):
            assert [c[0] for c in cands] == p.topk(3).indices.tolist()
            assert torch.allclose(torch.tensor([c[1] for c in cands], dtype=torch.float64), p.topk(3).values.double(), atol=1e-6)
