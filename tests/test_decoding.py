"""The decoder core, token for token against slow obvious paths and transformers' own greedy generate."""

import math

import pytest
import torch

from mars.decoding.acceptance import accept_length, accept_lengths, choose_and_score, repeat_flags, repeat_flags_list
from mars.decoding.decoder import DecodeConfig, DecodeControl, decode_steps, encode_prompt, generate_ids, stream

PROMPTS = [
    "what is the capital of france ?",
    "tell me a word",
    "add 2 + 3 = ?",
    "write a long sentence about the water and the earth and the air and the people who live here",
]


def hf_greedy(lm, ids, n):
    x = torch.tensor([ids])
    out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def encode_all(lm, prompts=PROMPTS):
    return [encode_prompt(lm.tokenizer, p) for p in prompts]


# ---- acceptance rule and confidence measures (pure functions)


def test_accept_lengths_rule():
    conf = torch.tensor([[0.2, 0.95, 0.91, 0.5], [0.99, 0.5, 0.99, 0.99], [0.1, 0.9, 0.9, 0.9]])
    assert accept_lengths(conf, 0.9).tolist() == [3, 1, 4]
    assert accept_lengths(conf, 1.0).tolist() == [1, 1, 1]  # tau 1 is exactly AR
    assert accept_lengths(torch.ones(1, 4), 1.0).tolist() == [1]  # even for saturated probabilities
    assert accept_lengths(conf, 0.0).tolist() == [4, 4, 4]
    assert accept_lengths(conf, 0.0, max_per_pass=2).tolist() == [2, 2, 2]


def test_repeat_flags_by_hand():
    t = lambda *x: torch.tensor(x)
    # "in Europe | Europe , Europe Europe": AR token 0 never counts against the drafts' rule but is flagged as data
    assert repeat_flags([1, 2], t(2, 3, 3, 3)).tolist() == [True, False, True, True]
    # "South America South America": the 2-token repeat is seen at its last token, across the context edge
    assert repeat_flags([9, 5, 6], t(5, 6, 7)).tolist() == [False, True, False]
    assert repeat_flags([5, 6, 5], t(6, 5, 6)).tolist() == [True, True, True]  # 5 6 5 6, then 6 5 6 5, then 5 6 5 6
    assert repeat_flags([], t(4, 4)).tolist() == [False, True]
    assert repeat_flags([1, 2, 3], t(4, 5, 6), max_ngram=1).tolist() == [False, False, False]


def test_accept_lengths_repeat_guard():
    conf = torch.tensor([[0.2, 0.95, 0.97, 0.99], [0.2, 0.95, 0.97, 0.99], [0.2, 0.95, 0.5, 0.99]])
    reps = torch.tensor([[False, False, True, False], [True, False, False, True], [False, True, False, False]])
    assert accept_lengths(conf, 0.9, repeats=reps, repeat_tau=0.995).tolist() == [2, 3, 1]
    assert accept_lengths(conf, 0.9, repeats=reps, repeat_tau=0.98).tolist() == [2, 4, 1]
    assert accept_lengths(conf, 0.9, repeats=reps, repeat_tau=0.96).tolist() == [4, 4, 1]
    assert accept_lengths(conf, 0.9, repeats=reps, repeat_tau=None).tolist() == [4, 4, 2]  # no guard
    assert accept_lengths(torch.ones(1, 4), 0.9, repeats=torch.ones(1, 4, dtype=torch.bool),
                          repeat_tau=1.0).tolist() == [1]  # 1.0: a repeat is never a draft, even saturated
    assert accept_lengths(conf, 1.0, repeats=reps, repeat_tau=0.0).tolist() == [1, 1, 1]  # tau 1 is still AR


def test_confidence_measures():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [1.0 / 3, 1.0 / 3, 1.0 / 3]]))
    tok, p = choose_and_score(logits, "prob")
    assert tok.tolist()[0] == 0 and p[0].item() == pytest.approx(0.7)
    _, m = choose_and_score(logits, "margin")
    assert m[0].item() == pytest.approx(0.5) and m[1].item() == pytest.approx(0.0, abs=1e-6)
    _, e = choose_and_score(logits, "entropy")
    assert e[1].item() == pytest.approx(1 / 3, rel=1e-5)  # exp(-ln 3)
    h = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert e[0].item() == pytest.approx(math.exp(-h), rel=1e-5)
    with pytest.raises(ValueError):
        choose_and_score(logits, "vibes")


# ---- token-for-token equivalences on the tiny model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tau1_mars_equals_ar_equals_hf_generate(arch, tiny_lm, tiny_qwen):
    lm = tiny_lm if arch == "llama" else tiny_qwen
    for ids in encode_all(lm):
        ref = hf_greedy(lm, ids, 40)
        ar = generate_ids(lm, [ids], DecodeConfig(mode="ar", max_new_tokens=40))[0]
        assert ar.token_ids == ref
        for B in (2, 4, 8):
            mars = generate_ids(lm, [ids], DecodeConfig(mode="mars", tau=1.0, block_size=B, max_new_tokens=40))[0]
            assert mars.token_ids == ref


def test_ar_mode_forwards_equal_tokens(tiny_lm):
    for ids in encode_all(tiny_lm):
        res = generate_ids(tiny_lm, [ids], DecodeConfig(mode="ar", max_new_tokens=25))[0]
        assert res.passes == len(res.token_ids)
        assert all(len(s.token_ids) == 1 and s.rejected_token_ids == [] for s in res.steps)


@pytest.mark.parametrize("tau", [0.9, 0.5, 0.2, 0.0])
@pytest.mark.parametrize("B", [2, 3, 4, 8])
def test_cached_equals_uncached(tiny_lm, tau, B):
    ids = encode_all(tiny_lm)
    cfg = dict(mode="mars", tau=tau, block_size=B, max_new_tokens=30)
    for p in ids:
        a = generate_ids(tiny_lm, [p], DecodeConfig(**cfg))[0]
        b = generate_ids(tiny_lm, [p], DecodeConfig(**cfg, use_cache=False))[0]
        assert a.token_ids == b.token_ids
        assert [len(s.token_ids) for s in a.steps] == [len(s.token_ids) for s in b.steps]


@pytest.mark.parametrize("mode,tau,B,cache_block", [("ar", 1.0, 4, 32), ("mars", 1.0, 4, 32), ("mars", 0.3, 4, 8),
                                                     ("mars", 0.0, 3, 4), ("mars", 0.0, 8, 5), ("mars", 0.6, 6, 32)])
def test_batch_equals_each_prompt_alone(tiny_lm, mode, tau, B, cache_block):
    ids = encode_all(tiny_lm)
    cfg = DecodeConfig(mode=mode, tau=tau, block_size=B, max_new_tokens=40, cache_block=cache_block)
    batch = generate_ids(tiny_lm, ids, cfg)
    for p, res in zip(ids, batch):
        alone = generate_ids(tiny_lm, [p], cfg)[0]
        assert res.token_ids == alone.token_ids
        assert res.passes == alone.passes
    unc = generate_ids(tiny_lm, ids, DecodeConfig(mode=mode, tau=tau, block_size=B, max_new_tokens=40, use_cache=False))
    assert [r.token_ids for r in unc] == [r.token_ids for r in batch]


def test_block_cache_keeps_rows_within_a_cache_block(tiny_lm):
    ids = encode_all(tiny_lm)
    cfg = DecodeConfig(mode="mars", tau=0.0, block_size=4, max_new_tokens=40, cache_block=8)
    widths = []
    for records in decode_steps(tiny_lm, ids, cfg):
        widths.extend(r.input_len for r in records)
    # uncached window per row <= cache block + the tokens of one pass + B-1 masks
    assert max(widths[len(ids):]) <= 8 + 4 + 3


def test_low_tau_takes_fewer_passes(tiny_lm):
    ids = encode_all(tiny_lm)[3]
    hi = generate_ids(tiny_lm, [ids], DecodeConfig(tau=1.0, max_new_tokens=40))[0]
    lo = generate_ids(tiny_lm, [ids], DecodeConfig(tau=0.0, max_new_tokens=40))[0]
    assert lo.passes < hi.passes
    assert lo.tokens_per_pass > 1.5


def test_live_tau_change_reaches_the_next_pass(tiny_lm):
    ids = encode_all(tiny_lm)[3]
    control = DecodeControl()
    seen = []
    for rec in stream(tiny_lm, ids, DecodeConfig(tau=1.0, max_new_tokens=40), control):
        seen.append(rec)
        if rec.pass_index == 2:
            control.tau = 0.0
    assert [r.tau for r in seen[:3]] == [1.0, 1.0, 1.0]
    assert all(r.tau == 0.0 for r in seen[3:])
    assert all(len(r.token_ids) == 1 for r in seen[:3])
    assert max(len(r.token_ids) for r in seen[3:]) > 1


def test_cancel_ends_the_run_before_the_next_pass(tiny_lm):
    ids = encode_all(tiny_lm)
    control = DecodeControl()
    passes = 0
    for _ in decode_steps(tiny_lm, ids, DecodeConfig(tau=0.9, max_new_tokens=40), control):
        passes += 1
        if passes == 2:
            control.cancel()
    assert passes == 2
    res = generate_ids(tiny_lm, ids[:1], DecodeConfig(max_new_tokens=40), control)[0]
    assert res.finish_reason == "cancelled" and res.token_ids == []


def test_stops_max_tokens_eos_and_stop_strings(tiny_lm):
    tok = tiny_lm.tokenizer
    ids = encode_all(tiny_lm)[3]
    free = generate_ids(tiny_lm, [ids], DecodeConfig(tau=0.0, max_new_tokens=17))[0]
    assert len(free.token_ids) == 17 and free.finish_reason == "length"
    # a stop string taken from the free-running text cuts the run right after it
    word = tok.decode(free.token_ids[5:6])
    stopped = generate_ids(tiny_lm, [ids], DecodeConfig(tau=0.0, max_new_tokens=17, stop_strings=(word,)))[0]
    assert stopped.finish_reason == "stop" and word in stopped.text
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)] and len(stopped.token_ids) <= 6
    # EOS: find a prompt whose greedy run emits EOS; the EOS is the last generated id
    eos = tiny_lm.eos_token_ids[0]
    runs = [generate_ids(tiny_lm, [p], DecodeConfig(mode="ar", max_new_tokens=40))[0] for p in encode_all(tiny_lm)]
    ended = [r for r in runs if r.finish_reason == "eos"]
    assert ended, "the tiny model should end at least one of the prompts"
    for r in ended:
        assert r.token_ids[-1] == eos and eos not in r.token_ids[:-1]


def test_seeded_sampling_is_reproducible(tiny_lm):
    ids = encode_all(tiny_lm)[0]
    cfg = dict(tau=0.5, max_new_tokens=30, temperature=1.0)
    a = generate_ids(tiny_lm, [ids], DecodeConfig(**cfg, seed=1))[0]
    b = generate_ids(tiny_lm, [ids], DecodeConfig(**cfg, seed=1))[0]
    c = generate_ids(tiny_lm, [ids], DecodeConfig(**cfg, seed=2))[0]
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_records_carry_what_the_ui_needs(tiny_lm):
    ids = encode_all(tiny_lm)[0]
    recs = list(stream(tiny_lm, ids, DecodeConfig(tau=0.5, block_size=4, max_new_tokens=12, top_k=3)))
    for r in recs:
        assert len(r.token_ids) + len(r.rejected_token_ids) == 4 or r.finish_reason
        assert len(r.confidences) == len(r.token_ids) and len(r.candidates) == 4
        assert all(0.0 <= c <= 1.0 for c in r.confidences + r.rejected_confidences)
        assert r.seconds > 0 and r.input_len >= 4
    assert "".join(r.text for r in recs).strip() == tiny_lm.tokenizer.decode(
        sum((r.token_ids for r in recs), []), skip_special_tokens=True).strip()


def test_bad_configs_are_refused(tiny_lm):
    for bad in (dict(tau=1.5), dict(tau=float("nan")), dict(tau="0.9"), dict(block_size=0), dict(block_size=2.5),
                dict(max_new_tokens=0), dict(mode="fast"), dict(confidence="x"), dict(cache_block=0)):
        with pytest.raises(ValueError):
            DecodeConfig(**bad)
    with pytest.raises(ValueError):
        DecodeControl().tau = 2
    with pytest.raises(ValueError, match="context"):
        generate_ids(tiny_lm, [[5] * 500], DecodeConfig(max_new_tokens=100))
    with pytest.raises(ValueError):
        generate_ids(tiny_lm, [[]], DecodeConfig())


def test_model_without_mask_token_runs_ar_only():
    import tiny

    lm = tiny.make_loaded(mask=False)
    ids = encode_prompt(lm.tokenizer, "tell me a word")
    with pytest.raises(ValueError, match="mask token"):
        generate_ids(lm, [ids], DecodeConfig(mode="mars"))
    assert len(generate_ids(lm, [ids], DecodeConfig(mode="ar", max_new_tokens=5))[0].token_ids) == 5


# ---- the default model (float32)

DEFAULT_PROMPTS = ["What is the capital of France?", "Write a Python function that adds two numbers.",
                   "List three fruits.", "Explain in one sentence why the sky is blue."]


def test_default_model_tau1_and_ar_equal_hf_generate(default_lm):
    for p in DEFAULT_PROMPTS[:3]:
        ids = encode_prompt(default_lm.tokenizer, p)
        ref = hf_greedy(default_lm, ids, 32)
        assert generate_ids(default_lm, [ids], DecodeConfig(mode="ar", max_new_tokens=32))[0].token_ids == ref
        assert generate_ids(default_lm, [ids], DecodeConfig(mode="mars", tau=1.0, max_new_tokens=32))[0].token_ids == ref


def test_default_model_batch_equals_alone_and_cached_equals_uncached(default_lm):
    ids = [encode_prompt(default_lm.tokenizer, p) for p in DEFAULT_PROMPTS]
    cfg = DecodeConfig(mode="mars", tau=0.5, max_new_tokens=24, cache_block=8)
    batch = generate_ids(default_lm, ids, cfg)
    for p, res in zip(ids, batch):
        assert res.token_ids == generate_ids(default_lm, [p], cfg)[0].token_ids
    unc = generate_ids(default_lm, ids[:2], DecodeConfig(mode="mars", tau=0.5, max_new_tokens=24, use_cache=False))
    assert [r.token_ids for r in unc] == [r.token_ids for r in batch[:2]]


# ---- lossless modes: verified (MARS drafts checked by the model's own AR logits) and Jacobi


@pytest.mark.parametrize("cache_block", [2, 3, 4, 5, 7])
def test_batch_stays_exact_when_rows_run_ahead_by_verified_drafts(tiny_lm, cache_block):
    """Rows idle at the cache-block end while another row's verified extras carry it past that end: the
    commit must still leave every row a token to feed (a bench at batch 4 once cut rows short this way).
    An oracle Jacobi guesses 0-3 of the true next tokens per pass, varying by row and step, so rows run
    ahead of each other in every pattern; the output must stay AR greedy."""
    import mars.decoding.decoder as decoding
    from mars.decoding.modes import JacobiMode

    ids = encode_all(tiny_lm)
    ar = [generate_ids(tiny_lm, [p], DecodeConfig(mode="ar", max_new_tokens=40))[0].token_ids for p in ids]

    class OracleJacobi(JacobiMode):
        def plan(self, row, cfg, tau):
            k = len(row.generated)
            good = (7 * row.index + 3 * k) % 4  # how many of the guesses are right this pass
            guesses = ar[row.index][k:k + good]
            return decoding.RowPlan(to_verify=guesses + [tiny_lm.tokenizer.pad_token_id or 0] * (3 - len(guesses)))

    cfg = DecodeConfig(mode="jacobi", block_size=4, max_new_tokens=40, cache_block=cache_block)
    batch = generate_ids(tiny_lm, ids, cfg, mode=OracleJacobi())
    assert [r.token_ids for r in batch] == ar
    assert sum(r.passes for r in batch) < sum(len(t) for t in ar)  # the oracle did run rows ahead


@pytest.mark.parametrize("mode,B,groups,tau", [("verified", 4, "all", 0.0), ("verified", 4, "last", 0.0),
                                               ("verified", 3, "all", 0.5), ("verified", 8, "all", 0.0),
                                               ("jacobi", 4, "all", 0.0), ("jacobi", 6, "all", 0.0)])
def test_lossless_modes_reproduce_ar_greedy_alone_batched_and_uncached(tiny_lm, mode, B, groups, tau):
    ids = encode_all(tiny_lm)
    ar = [generate_ids(tiny_lm, [p], DecodeConfig(mode="ar", max_new_tokens=50))[0].token_ids for p in ids]
    kw = dict(mode=mode, block_size=B, verify_groups=groups, tau=tau, max_new_tokens=50)
    alone = [generate_ids(tiny_lm, [p], DecodeConfig(**kw, cache_block=8))[0] for p in ids]
    assert [r.token_ids for r in alone] == ar
    assert [r.token_ids for r in generate_ids(tiny_lm, ids, DecodeConfig(**kw, cache_block=8))] == ar
    assert [r.token_ids for r in generate_ids(tiny_lm, ids, DecodeConfig(**kw, use_cache=False))] == ar
    for r in alone:
        for s in r.steps:
            assert s.drafts_sent <= B - 1 and len(s.token_ids) <= s.drafts_sent + 1


def test_verified_mode_accepts_matching_drafts(tiny_lm):
    ids = encode_all(tiny_lm)
    runs = [generate_ids(tiny_lm, [p], DecodeConfig(mode="verified", tau=0.0, max_new_tokens=50))[0] for p in ids]
    assert max(r.tokens_per_pass for r in runs) > 1.0  # some drafts of this seeded model match AR
    # drafts that were sent and failed show up as rejected tokens
    assert any(s.rejected_token_ids for r in runs for s in r.steps)


def test_verified_tau_one_sends_no_drafts(tiny_lm):
    ids = encode_all(tiny_lm)[0]
    res = generate_ids(tiny_lm, [ids], DecodeConfig(mode="verified", tau=1.0, max_new_tokens=20))[0]
    assert all(s.drafts_sent == 0 for s in res.steps) and res.passes == len(res.token_ids)


def test_default_model_verified_equals_ar(default_lm):
    for p in DEFAULT_PROMPTS[:2]:
        ids = encode_prompt(default_lm.tokenizer, p)
        ar = generate_ids(default_lm, [ids], DecodeConfig(mode="ar", max_new_tokens=32))[0].token_ids
        assert generate_ids(default_lm, [ids], DecodeConfig(mode="verified", tau=0.0, max_new_tokens=32))[0].token_ids == ar


def test_run_record_filled_while_streaming_equals_the_finished_run(tiny_lm):
    from mars.decoding.records import RunRecord, RunTotals

    ids = encode_all(tiny_lm)
    cfg = DecodeConfig(tau=0.5, block_size=4, max_new_tokens=20, cache_block=8)
    done = generate_ids(tiny_lm, ids, cfg)
    live = [RunRecord(cfg, p) for p in ids]
    for records in decode_steps(tiny_lm, ids, cfg):
        for rec in records:
            live[rec.row].add([rec])
        assert all(r.passes == len(r.steps) and r.tokens == len(r.token_ids) for r in live)  # readable mid-run
    for a, b in zip(live, done):
        assert (a.token_ids, a.passes, a.finish_reason) == (b.token_ids, b.passes, b.finish_reason)
        assert a.tokens_per_pass == a.tokens / a.passes and a.config is cfg
        d = b.to_dict()
        assert d["passes"] == len(d["steps"]) and d["config"]["tau"] == 0.5 and "row" not in d["steps"][0]
    t = RunTotals.of(done)
    assert t.tokens == sum(len(r.token_ids) for r in done) and t.passes == sum(len(r.steps) for r in done)
    assert sum(k * n for k, n in t.histogram.items()) == t.tokens and sum(t.histogram.values()) == t.passes
    assert t.batch_passes == len({s.pass_index for r in done for s in r.steps}) <= t.passes
    # a batch pass's wall time counts once in batch_seconds, once per row in decode_seconds
    per_pass = {s.pass_index: s.seconds for r in done for s in r.steps}
    assert t.batch_seconds == pytest.approx(sum(per_pass.values())) and 0 < t.batch_seconds < t.decode_seconds
    assert t.tokens_per_batch_pass == t.tokens / t.batch_passes and t.tokens_per_second == t.tokens / t.batch_seconds
    both = t + RunTotals.of(done[:1])
    assert (both.runs, both.tokens, both.batch_passes) == (5, t.tokens + done[0].tokens,
                                                           t.batch_passes + done[0].passes)
    assert both.batch_seconds == pytest.approx(t.batch_seconds + done[0].decode_seconds)


def test_run_record_carries_what_the_app_shows_prompt_wall_clock_and_token_texts(tiny_lm):
    from mars.decoding.records import RunRecord

    prompt = "The cat"
    ids = encode_prompt(tiny_lm.tokenizer, prompt)
    cfg = DecodeConfig(tau=0.5, block_size=4, max_new_tokens=12)
    run, control = RunRecord(cfg, ids, prompt=prompt), DecodeControl()
    for rec in stream(tiny_lm, ids, cfg, control):
        rec.token_texts = [tiny_lm.tokenizer.decode([t]) for t in rec.token_ids]
        run.add(rec)
        assert run.finished is None  # running: the clock still goes
        control.cancel()  # stopped after the first pass
    run.finish(cancelled=control.cancelled)
    assert run.passes == 1 and run.finish_reason == "cancelled" and run.prompt == prompt
    assert run.elapsed == run.finished - run.started >= run.decode_seconds  # frozen once finished
    step = run.to_dict()["steps"][0]
    assert "".join(step["token_texts"]) == tiny_lm.tokenizer.decode(run.token_ids) and "rejected_texts" not in step


def test_config_is_checked_and_normalised_once_with_one_message_per_setting():
    from mars.decoding.decoder import MAX_BLOCK_SIZE, check_tau, context_needed

    cfg = DecodeConfig(block_size=4.0, tau=1, max_new_tokens=16.0, stop_strings="###")  # as sliders send them
    assert (cfg.block_size, cfg.tau, cfg.max_new_tokens, cfg.stop_strings) == (4, 1.0, 16, ("###",))
    assert type(cfg.block_size) is int and type(cfg.tau) is float
    with pytest.raises(ValueError, match=f"block size must be a whole number between 1 and {MAX_BLOCK_SIZE}, got 65"):
        DecodeConfig(block_size=65)
    with pytest.raises(ValueError, match="mode must be one of mars, ar, verified, jacobi, got 'x'"):
        DecodeConfig(mode="x")
    with pytest.raises(ValueError, match=r"got 'aaaaa.*\.\.\.$"):
        DecodeConfig(confidence="a" * 10_000)  # a client's megabyte is not echoed back
    for bad in (1.5, float("nan"), "0.9", True):  # the live control and the config refuse the same values alike
        with pytest.raises(ValueError) as from_config:
            DecodeConfig(tau=bad)
        with pytest.raises(ValueError) as from_control:
            DecodeControl(bad)
        assert str(from_config.value) == str(from_control.value)
        with pytest.raises(ValueError):
            check_tau(bad)
    assert DecodeControl(0.5).tau == 0.5 and DecodeControl().tau is None
    assert context_needed(10, DecodeConfig(max_new_tokens=20, block_size=4)) == 10 + 20 + 8


def test_default_block_size_comes_from_the_model(tiny_lm):
    from dataclasses import replace

    from mars.decoding.decoder import DEFAULT_BLOCK_SIZE

    assert replace(tiny_lm, trained_block_size=None).default_block_size == DEFAULT_BLOCK_SIZE
    assert replace(tiny_lm, trained_block_size=8).default_block_size == 8


def test_cli_choices_come_from_the_registries():
    from mars.decoding.acceptance import CONFIDENCE_MEASURES
    from mars.runtime.backends import BACKENDS
    from mars.cli import build_parser
    from mars.decoding.modes import MODES

    gen = build_parser()._subparsers._group_actions[0].choices["generate"]
    choices = {a.dest: a.choices for a in gen._actions if a.choices}
    assert choices["mode"] == list(MODES) and choices["backend"] == list(BACKENDS)
    assert choices["confidence"] == list(CONFIDENCE_MEASURES)


# ---- verified mode with drafts from n-gram lookup, or from whichever source the "both" rule prefers


REPEAT_PROMPTS = [
    "the water and the earth and the air and the water and the earth and the",
    "one two three one two three one two",
    "tell me a word",
    "add 2 + 3 = ? add 2 + 3 = ? add 2 +",
]


def test_lookup_drafts_copy_the_latest_longest_match():
    from mars.decoding.lookup import lookup_drafts

    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    look = lookup_drafts(toks, max_ngram=3)
    assert (look.ngram, look.drafts) == (2, [7, 8, 5, 2])  # "2 3" last seen before "7 8 5 2 3"; 2n copied
    assert look.expected > lookup_drafts([4, 5, 6, 5]).expected > lookup_drafts([4, 5, 6]).expected == 0
    assert lookup_drafts(toks, max_ngram=3, per_matched=3).drafts == [7, 8, 5, 2, 3]
    assert lookup_drafts(toks, max_ngram=3, max_drafts=2).drafts == [7, 8]
    assert lookup_drafts([1, 2, 3, 1, 2], max_ngram=3).drafts == [3, 1, 2]  # the copy may run into the suffix
    assert lookup_drafts([4, 5, 6], max_ngram=3).ngram == 0  # nothing repeats
    assert lookup_drafts([4, 5, 6, 5], max_ngram=3).drafts == [6, 5]  # a one-token match
    assert lookup_drafts([4], max_ngram=3).drafts == []


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("drafts,groups", [("lookup", "last"), ("both", "last"), ("both", "all")])
@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_verified_with_lookup_drafts_reproduces_ar_greedy(tiny_lm, tiny_qwen, arch, drafts, groups, backend):
    lm = tiny_lm if arch == "llama" else tiny_qwen
    ids = encode_all(lm, REPEAT_PROMPTS)  # different lengths: the batch is left-padded
    ar = [generate_ids(lm, [p], DecodeConfig(mode="ar", max_new_tokens=40))[0].token_ids for p in ids]
    kw = dict(mode="verified", drafts=drafts, verify_groups=groups, tau=0.0, max_new_tokens=40, backend=backend)
    alone = [generate_ids(lm, [p], DecodeConfig(**kw, cache_block=8))[0] for p in ids]
    assert [r.token_ids for r in alone] == ar
    assert [r.token_ids for r in generate_ids(lm, ids, DecodeConfig(**kw, cache_block=8))] == ar
    assert [r.token_ids for r in generate_ids(lm, ids, DecodeConfig(**kw, use_cache=False))] == ar
    steps = [s for r in alone for s in r.steps]
    assert all(s.draft_source in ("mars", "lookup") if s.drafts_sent else s.draft_source is None for s in steps)
    copied = [s for s in steps if s.draft_source == "lookup"]
    assert copied, "lookup drafts should fire on these repetitive prompts"
    if drafts == "lookup":
        assert all(s.draft_source in ("lookup", None) for s in steps)
        assert any(len(s.token_ids) > 1 for s in copied)  # some copies were right: rows ran ahead
    for s in steps:
        assert len(s.token_ids) <= s.drafts_sent + 1
        assert len(s.rejected_confidences) == len(s.rejected_token_ids)
        assert all(0.0 <= c <= 1.0 for c in s.rejected_confidences)


def test_lookup_drafts_need_no_mask_token():
    import tiny

    lm = tiny.make_loaded(mask=False)
    ids = encode_prompt(lm.tokenizer, REPEAT_PROMPTS[1])
    ar = generate_ids(lm, [ids], DecodeConfig(mode="ar", max_new_tokens=30))[0].token_ids
    assert generate_ids(lm, [ids], DecodeConfig(mode="verified", drafts="lookup", max_new_tokens=30))[0].token_ids == ar
    with pytest.raises(ValueError, match="mask token"):
        generate_ids(lm, [ids], DecodeConfig(mode="verified", drafts="both", max_new_tokens=30))


def test_draft_sources_are_checked_once_in_the_config():
    with pytest.raises(ValueError, match="drafts must be one of"):
        DecodeConfig(mode="verified", drafts="medusa")
    with pytest.raises(ValueError, match="needs mode 'verified'"):
        DecodeConfig(mode="mars", drafts="lookup")


REWRITE = ("Rewrite this sentence in the passive voice: The committee approved the new budget for the "
           "public library after a long debate about the costs of the renovation.")


@pytest.mark.parametrize("drafts", ["lookup", "both"])
def test_default_model_lookup_drafts_are_accepted_and_exact(default_lm, drafts):
    ids = encode_prompt(default_lm.tokenizer, REWRITE)
    ar = generate_ids(default_lm, [ids], DecodeConfig(mode="ar", max_new_tokens=40))[0].token_ids
    cfg = DecodeConfig(mode="verified", drafts=drafts, verify_groups="last", tau=0.0, max_new_tokens=40)
    res = generate_ids(default_lm, [ids], cfg)[0]
    assert res.token_ids == ar
    copied = [s for s in res.steps if s.draft_source == "lookup"]
    assert sum(len(s.token_ids) - 1 for s in copied) >= 5  # the copies of the prompt's words were taken
    assert res.tokens_per_pass > 1.3
    batch = generate_ids(default_lm, [ids, encode_prompt(default_lm.tokenizer, DEFAULT_PROMPTS[0])], cfg)
    assert batch[0].token_ids == ar


# ---- the repeat guard (DecodeConfig.repeat_tau)


def _is_repeat(seq, j):
    """Slow and obvious: the 1 or 2 tokens ending at j equal the 1 or 2 just before them."""
    return (j >= 1 and seq[j] == seq[j - 1]) or (j >= 3 and seq[j - 1:j + 1] == seq[j - 3:j - 1])


@pytest.mark.parametrize("tau,B", [(0.0, 3), (0.0, 4), (0.0, 8)])
def test_repeat_guard_keeps_repeats_out_of_the_drafts(tiny_lm, tau, B):
    ids = encode_all(tiny_lm)
    stops = 0
    for p in ids:
        plain = generate_ids(tiny_lm, [p], DecodeConfig(tau=tau, block_size=B, max_new_tokens=40, repeat_tau=None))[0]
        run = generate_ids(tiny_lm, [p], DecodeConfig(tau=tau, block_size=B, max_new_tokens=40, repeat_tau=1.0))[0]
        seq = list(p)
        for s in run.steps:
            for k in range(1, len(s.token_ids)):  # no accepted draft repeats what stands before it
                assert not _is_repeat(seq + s.token_ids, len(seq) + k)
            if s.repeat_guard:  # the guard, not tau, cut the chain: the next proposal repeats and cleared tau
                assert s.rejected_confidences[0] >= tau and _is_repeat(seq + s.token_ids + s.rejected_token_ids[:1],
                                                                        len(seq) + len(s.token_ids))
            seq += s.token_ids
        stops += sum(s.repeat_guard for s in run.steps)
        # the guard is vacuous at or below tau: same tokens, same passes as no guard
        low = generate_ids(tiny_lm, [p], DecodeConfig(tau=tau, block_size=B, max_new_tokens=40, repeat_tau=tau))[0]
        assert low.token_ids == plain.token_ids and low.passes == plain.passes
        assert not any(s.repeat_guard for s in low.steps + plain.steps)
    assert stops > 0  # this seeded model does stutter, so the test exercised the guard


def test_repeat_guard_cached_uncached_batched_alone(tiny_lm):
    ids = encode_all(tiny_lm)
    cfg = dict(mode="mars", tau=0.0, block_size=4, max_new_tokens=40, repeat_tau=0.99)
    batch = generate_ids(tiny_lm, ids, DecodeConfig(**cfg, cache_block=8))
    alone = [generate_ids(tiny_lm, [p], DecodeConfig(**cfg))[0] for p in ids]
    unc = generate_ids(tiny_lm, ids, DecodeConfig(**cfg, use_cache=False))
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone] == [r.token_ids for r in unc]
    assert [r.passes for r in batch] == [r.passes for r in alone]


def test_repeat_guard_leaves_tau1_ar_and_verified_untouched(tiny_lm):
    for p in encode_all(tiny_lm):
        ar = generate_ids(tiny_lm, [p], DecodeConfig(mode="ar", max_new_tokens=40))[0].token_ids
        for rt in (0.0, 0.5, 1.0):
            assert generate_ids(tiny_lm, [p], DecodeConfig(tau=1.0, max_new_tokens=40, repeat_tau=rt))[0].token_ids == ar
        v = generate_ids(tiny_lm, [p], DecodeConfig(mode="verified", tau=0.0, max_new_tokens=40))[0]
        vg = generate_ids(tiny_lm, [p], DecodeConfig(mode="verified", tau=0.0, max_new_tokens=40, repeat_tau=1.0))[0]
        assert vg.token_ids == v.token_ids == ar and vg.passes == v.passes


def test_repeat_tau_is_checked_where_it_is_defined():
    assert DecodeConfig(repeat_tau=1).repeat_tau == 1.0
    for bad in (1.5, -0.1, float("nan"), "0.9", True):
        with pytest.raises(ValueError, match="repeat tau must be a number between 0 and 1"):
            DecodeConfig(repeat_tau=bad)


@pytest.mark.slow
def test_shipped_adapter_visitor_prompt_stutters_without_the_guard_not_with_it():
    """Issue 24: "Name three rivers in Europe." at tau 0.9 said "Europe Europe", "South America South America"."""
    from mars.evaluation.quality import stutters
    from mars.models.loading import load

    lm = load()  # the default model with the shipped adapter
    ids = encode_prompt(lm.tokenizer, "Name three rivers in Europe.")
    text = lambda **kw: generate_ids(lm, [ids], DecodeConfig(max_new_tokens=64, **kw))[0].text
    ar = text(mode="ar")
    assert stutters(text(tau=0.9, repeat_tau=None), ar)["extra"] > 0
    assert stutters(text(tau=0.9, repeat_tau=1.0), ar)["extra"] == 0
    assert text(tau=1.0, repeat_tau=1.0) == ar


def test_host_accept_length_equals_the_tensor_rule():
    """accept_length (Python, on fetched values) against accept_lengths (tensors), row by row: confidences
    exactly at tau's float32 rounding (where a float64 comparison would differ), the repeat guard, caps."""
    g = torch.Generator().manual_seed(0)
    taus = [0.0, 0.3, 0.7, 0.9, 0.95, 1.0]
    for _ in range(300):
        n = 1 + int(torch.randint(6, (), generator=g))
        tau = taus[int(torch.randint(len(taus), (), generator=g))]
        conf = torch.rand(n, generator=g)
        at_tau = torch.rand(n, generator=g) < 0.3
        conf[at_tau] = torch.tensor(tau, dtype=torch.float32)  # ties: 0.9f >= 0.9 in the tensor rule
        repeats = torch.rand(n, generator=g) < 0.4
        repeat_tau = [None, 0.5, 0.9, 1.0][int(torch.randint(4, (), generator=g))]
        cap = [None, 1, 2, 4][int(torch.randint(4, (), generator=g))]
        c = conf.tolist()
        assert accept_length(c, tau, cap) == int(accept_lengths(conf[None], tau, cap)[0])
        want = int(accept_lengths(conf[None], tau, cap, repeats[None], repeat_tau)[0])
        assert accept_length(c, tau, cap, repeats.tolist(), repeat_tau) == want, (c, tau, cap, repeat_tau)


def test_repeat_flags_list_equals_repeat_flags():
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        context = torch.randint(4, (int(torch.randint(5, (), generator=g)),), generator=g).tolist()
        props = torch.randint(4, (1 + int(torch.randint(5, (), generator=g)),), generator=g)
        assert repeat_flags_list(context, props.tolist()) == repeat_flags(context, props).tolist()
