"""The scheduler (mars.decoding.scheduler): rows of different modes, widths and settings join and leave one
shared forward pass at any time, and every row's tokens equal its solo run (issue 53, item 2)."""

from __future__ import annotations

import pytest
import torch

import tiny
from mars.decoding import scheduler as sched_mod
from mars.decoding.decoder import DecodeConfig, DecodeControl, encode_prompt, generate_ids
from mars.decoding.scheduler import Scheduler

PROMPTS = [
    "what is the capital of france ?",
    "add 2 + 3 = ?",
    "tell me a word about the water and the land and the light of the old house",
    "the man said that the boy was in the house",
    "write a long sentence about the world",
    "how many people live in the big land ?",
]

# (config, joins at pass): a room of ragged rows, from one token a pass to a tree with its groups
ROOM = [
    (dict(mode="ar", block_size=1), 0),
    (dict(mode="mars", tau=0.5, block_size=4), 0),
    (dict(mode="verified", tau=0.0, block_size=4), 2),
    (dict(mode="verified", tau=0.0, block_size=2, tree_nodes=4, drafts="both", verify_groups="last"), 3),
    (dict(mode="mars", tau=0.7, block_size=3, stop_strings=("land",)), 5),
    (dict(mode="jacobi", block_size=3), 7),
]


def solo(lm, ids, cfg):
    return generate_ids(lm, [ids], cfg)[0].token_ids


def run_room(lm, room, backend, max_new=24, joins=None, prefill_chunk=sched_mod.PREFILL_CHUNK, on_pass=None):
    """Every row of `room` joins the scheduler at its pass; returns ({row index: tokens}, rows, passes' stats)."""
    s = Scheduler(lm, backend, prefill_chunk=prefill_chunk)
    pending = sorted(((at, i, kw) for i, (kw, at) in enumerate(room)), key=lambda t: t[0])
    rows, out, stats, p = {}, {}, [], 0
    while pending or not s.idle:
        while pending and pending[0][0] <= p:
            _, i, kw = pending.pop(0)
            cfg = DecodeConfig(**kw, max_new_tokens=max_new, backend=backend)
            rows[i] = s.add(encode_prompt(lm.tokenizer, PROMPTS[i % len(PROMPTS)]), cfg, DecodeControl(), index=i)
        for rec in s.step():
            out.setdefault(rec.row, []).extend(rec.token_ids)
        if s.last is not None:
            stats.append(s.last)
        if on_pass:
            on_pass(p, s, rows)
        p += 1
        assert p < 2000
    return out, rows, stats


@pytest.mark.parametrize("backend", ["hf", "fast", "static"])
def test_ragged_rows_joining_and_leaving_equal_their_solo_runs(tiny_lm, backend):
    out, rows, stats = run_room(tiny_lm, ROOM, backend)
    for i, (kw, _) in enumerate(ROOM):
        cfg = DecodeConfig(**kw, max_new_tokens=24, backend=backend)
        assert out[i] == solo(tiny_lm, encode_prompt(tiny_lm.tokenizer, PROMPTS[i]), cfg), (i, kw)
        assert rows[i].finish_reason in ("eos", "length", "stop")
    assert max(st.rows for st in stats) >= 4  # they did share passes
    assert len({tuple(st.widths) for st in stats}) > 3  # of different widths


def test_int8_rows_equal_their_int8_solo_runs():
    lm = tiny.make_loaded("qwen2", seed=4, dtype=torch.float32)
    out, _, _ = run_room(lm, ROOM[:4], "fast-int8", max_new=20)
    for i, (kw, _) in enumerate(ROOM[:4]):
        cfg = DecodeConfig(**kw, max_new_tokens=20, backend="fast-int8")
        assert out[i] == solo(lm, encode_prompt(lm.tokenizer, PROMPTS[i]), cfg), i


def test_a_long_prompt_joins_in_chunks_and_stays_exact(tiny_lm):
    """A long prompt joining a room of decoding rows goes in chunks (a pass at most about doubles), and a room
    filling up (as many joining as decoding) takes its prompts whole; every row equals its solo run."""
    long_prompt = " ".join(["the old man said that the boy was in the house"] * 6)
    ids = encode_prompt(tiny_lm.tokenizer, long_prompt)
    assert len(ids) > 40
    s = Scheduler(tiny_lm, "fast", prefill_chunk=8)
    cfg = DecodeConfig(mode="mars", tau=0.6, block_size=4, max_new_tokens=30, backend="fast")
    short = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS[:3]]
    firsts = [s.add(p, cfg, DecodeControl()) for p in short]
    got = {i: [] for i in range(4)}
    widths = []
    for p in range(200):
        if p == 3:
            late = s.add(ids, cfg, DecodeControl())
        for rec in s.step():
            got[rec.row].extend(rec.token_ids)
        if s.last:
            widths.append(max(s.last.widths))
        if s.idle:
            break
    for i, p in enumerate(short):
        assert got[i] == solo(tiny_lm, p, cfg)
    assert got[3] == solo(tiny_lm, ids, cfg)
    assert all(r.finish_reason for r in firsts + [late])
    # beside three decoding rows (~4 inputs each) no pass fed the long prompt whole: chunks of max(8, ~12)
    assert max(widths[3:8]) < 24 < len(ids)
    assert late.passes - late.passes_planned >= 2  # its prefill took passes of its own

    # a room filling up: one row decoding, one joining with a long prompt: it goes whole, at once
    s = Scheduler(tiny_lm, "fast", prefill_chunk=8)
    s.add(short[0], cfg, DecodeControl())
    s.step()
    late = s.add(ids, cfg, DecodeControl())
    s.step()
    assert late.passes_planned == 1 and max(s.last.widths) >= len(ids)


def test_live_tau_stop_and_departure_touch_only_their_row(tiny_lm):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS[:3]]
    cfg = DecodeConfig(mode="mars", tau=0.9, block_size=4, max_new_tokens=30, backend="fast")
    s = Scheduler(tiny_lm, "fast")
    controls = [DecodeControl() for _ in ids]
    rows = [s.add(p, cfg, c) for p, c in zip(ids, controls)]
    got = {i: [] for i in range(3)}
    n_recs = {i: 0 for i in range(3)}
    while not s.idle:
        for rec in s.step():
            got[rec.row].extend(rec.token_ids)
            n_recs[rec.row] += 1
            if rec.row == 0 and n_recs[0] == 2:
                controls[0].tau = 0.3  # row 0's slider moves; the others' do not
            if rec.row == 1 and n_recs[1] == 3:
                controls[1].cancel()  # row 1's visitor presses Stop (or goes)
    assert rows[1].finish_reason == "cancelled" and n_recs[1] == 3
    assert got[2] == solo(tiny_lm, ids[2], cfg)

    # row 0 alone with the same tau change after its second pass
    c = DecodeControl()
    alone = []
    from mars.decoding.decoder import decode_steps

    for k, recs in enumerate(decode_steps(tiny_lm, [ids[0]], cfg, c)):
        alone += recs[0].token_ids
        if k == 1:
            c.tau = 0.3
    assert got[0] == alone


def test_sampled_rows_draw_from_their_own_generator(tiny_lm):
    cfgs = [DecodeConfig(mode="mars", tau=0.8, block_size=3, temperature=1.0, seed=s, max_new_tokens=20,
                         backend="fast") for s in (1, 2, 3)]
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS[:3]]
    s = Scheduler(tiny_lm, "fast")
    got = {}
    for i, (p, cfg) in enumerate(zip(ids, cfgs)):
        s.add(p, cfg, DecodeControl())
        for rec in s.step():  # rows join one pass apart
            got.setdefault(rec.row, []).extend(rec.token_ids)
    while not s.idle:
        for rec in s.step():
            got.setdefault(rec.row, []).extend(rec.token_ids)
    for i, (p, cfg) in enumerate(zip(ids, cfgs)):
        assert got[i] == solo(tiny_lm, p, cfg)


def test_the_cache_is_packed_once_holes_dominate_and_stays_exact(tiny_lm):
    """Rows that come and go leave holes (a joining prompt's columns, a finished row's); the cache packs each
    row's keys to the left once it is over twice the fullest row's need, and tokens stay the solo ones."""
    room = [(dict(mode="ar", block_size=1), 0)] + [(dict(mode="verified", tau=0.0, block_size=4), 4 * k)
                                                     for k in range(1, 6)]
    lengths = []

    def watch(p, s, rows):
        if s.cache is not None:
            lengths.append((s.cache.length, int(s.cache.key_ok.sum(1).max())))

    out, _, _ = run_room(tiny_lm, room, "fast", max_new=40, on_pass=watch)
    for i, (kw, _) in enumerate(room):
        cfg = DecodeConfig(**kw, max_new_tokens=40, backend="fast")
        assert out[i] == solo(tiny_lm, encode_prompt(tiny_lm.tokenizer, PROMPTS[i % len(PROMPTS)]), cfg), i
    assert any(n < prev for (n, _), (prev, _) in zip(lengths[1:], lengths)), "never packed"
    assert all(n <= max(64, 2 * full) for n, full in lengths)


def test_hf_cache_packs_as_the_fast_one_does(tiny_lm):
    room = [(dict(mode="ar", block_size=1), 0)] + [(dict(mode="mars", tau=0.5, block_size=4), 5 * k)
                                                     for k in range(1, 5)]
    out, _, _ = run_room(tiny_lm, room, "hf", max_new=30)
    for i, (kw, _) in enumerate(room):
        cfg = DecodeConfig(**kw, max_new_tokens=30, backend="hf")
        assert out[i] == solo(tiny_lm, encode_prompt(tiny_lm.tokenizer, PROMPTS[i % len(PROMPTS)]), cfg), i


def test_a_row_of_another_backend_is_refused_with_a_message(tiny_lm):
    s = Scheduler(tiny_lm, "fast")
    with pytest.raises(ValueError, match="backend 'hf' cannot join"):
        s.add([1, 2], DecodeConfig(mode="ar", backend="hf"), DecodeControl())
    with pytest.raises(ValueError, match="at least one token"):
        s.add([], DecodeConfig(mode="ar", backend="fast"), DecodeControl())


def test_waves_of_int8_rows_joining_a_running_batch_equal_their_solo_runs():
    """The app's case: visitors' rows (MARS at six taus) arrive in two waves, the second while the first decodes;
    a joining row's cache row holds no key yet, and its columns must never leak into its attention."""
    lm = tiny.make_loaded()
    room = [(dict(mode="mars", tau=t, block_size=4), 0) for t in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)]
    room += [(kw, 3 + 2 * k) for k, (kw, _) in enumerate(room)]
    out, _, _ = run_room(lm, room, "fast-int8", max_new=24)
    for i, (kw, _) in enumerate(room):
        cfg = DecodeConfig(**kw, max_new_tokens=24, backend="fast-int8")
        assert out[i] == solo(lm, encode_prompt(lm.tokenizer, PROMPTS[i % len(PROMPTS)]), cfg), i


def test_under_load_a_tree_sends_only_the_nodes_that_pay_for_the_whole_pass():
    """tree.cut_rate with the shared pass (issue 53, item 3): alone the cut is today's; beside rows that bring
    many inputs and tokens, a node must add more than its inputs cost every row, so fewer nodes go."""
    from mars.decoding.tree import best_cut

    costs = tuple(1.0 + 0.2 * w for w in range(64))  # +20% of a 1-input pass per input, as on two AVX2 cores
    values = [0.6, 0.35, 0.2, 0.12, 0.08, 0.05]
    width = lambda k: 1 + k  # noqa: E731
    alone = best_cut(values, costs, width)
    assert alone == best_cut(values, costs, width, shared=(0, 0.0)) == best_cut(values, costs, width, shared=None)
    loaded = best_cut(values, costs, width, shared=(30, 20.0))  # 15 other rows of 2 inputs, ~1.3 tokens each
    assert 0 <= loaded < alone
    assert best_cut(values, tuple([1.0] * 64), width, shared=(30, 20.0)) == len(values)  # free inputs: all go


def test_tree_rows_in_a_room_send_fewer_drafts_and_keep_their_text(tiny_lm):
    costs = tuple(1.0 + 0.2 * w for w in range(64))
    kw = dict(mode="verified", tau=0.0, block_size=2, tree_nodes=6, drafts="both", verify_groups="last",
              pass_costs=costs, max_new_tokens=30, backend="fast")
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]
    alone = [generate_ids(tiny_lm, [p], DecodeConfig(**kw))[0] for p in ids]
    s = Scheduler(tiny_lm, "fast")
    for p in ids:
        s.add(p, DecodeConfig(**kw), DecodeControl())
    got, sent = {}, {}
    while not s.idle:
        for rec in s.step():
            got.setdefault(rec.row, []).extend(rec.token_ids)
            sent.setdefault(rec.row, []).append(rec.drafts_sent)
    assert [got[i] for i in range(len(ids))] == [r.token_ids for r in alone]
    per_pass = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert per_pass([d for i in sent for d in sent[i]]) < per_pass([s.drafts_sent for r in alone for s in r.steps])


def test_passes_of_more_rows_than_one_c_call_takes_go_in_pieces_and_equal_solo():
    """A room's pass can hold more inputs than the C layer loop takes in one call (MAX_C_ROWS): 12 rows of
    MARS at B 8 feed ~96 inputs a pass, and their first pass all 12 prompts. The pass then runs in pieces of
    live inputs (fastpath._c_forward_rows), and every row still equals its solo run."""
    from mars.runtime.fastpath import fast_model
    from mars.runtime.kernels import MAX_C_ROWS

    lm = tiny.make_loaded(dtype=torch.float32)  # the C layers run float32 activations
    if fast_model(lm.model, torch.int8).c_layers is None:
        pytest.fail("the int8 C layers did not build here: this test needs them (a compiler is on this machine)")
    room = [(dict(mode="mars", tau=0.3 + 0.05 * k, block_size=8), 0) for k in range(12)]
    out, _, stats = run_room(lm, room, "fast-int8", max_new=24, prefill_chunk=None)
    assert max(st.inputs for st in stats) > MAX_C_ROWS
    for i, (kw, _) in enumerate(room):
        cfg = DecodeConfig(**kw, max_new_tokens=24, backend="fast-int8")
        assert out[i] == solo(lm, encode_prompt(lm.tokenizer, PROMPTS[i % len(PROMPTS)]), cfg), i


@pytest.mark.parametrize("backend", ["hf", "fast", "fast-int8"])
def test_a_pass_where_no_row_plans_still_feeds_a_prompt_chunk(tiny_lm, backend):
    """Every decoding row held (their readers behind: mars.app.batching) while a long prompt goes in chunks: the
    pass reads no logits a row asked for, runs all the same, and changes nobody's tokens."""
    lm = tiny.make_loaded(dtype=torch.float32) if backend == "fast-int8" else tiny_lm
    long_ids = encode_prompt(lm.tokenizer, " ".join(["the old man said that the boy was in the house"] * 6))
    cfg = DecodeConfig(mode="mars", tau=0.6, block_size=4, max_new_tokens=16, backend=backend)
    s = Scheduler(lm, backend, prefill_chunk=8)
    short = [encode_prompt(lm.tokenizer, p) for p in PROMPTS[:2]]
    rows = [s.add(p, cfg, DecodeControl()) for p in short]
    got = {0: [], 1: [], 2: []}
    for rec in s.step():
        got[rec.row].extend(rec.token_ids)
    late = s.add(long_ids, cfg, DecodeControl())
    for _ in range(3):  # the two decoding rows held: passes of the chunked prompt alone
        assert s.step(hold={r.index for r in rows}) == []
    assert late.n_cached > 0 and not late.decoding
    while not s.idle:
        for rec in s.step():
            got[rec.row].extend(rec.token_ids)
    for i, p in enumerate(short + [long_ids]):
        assert got[i] == solo(lm, p, cfg), i
