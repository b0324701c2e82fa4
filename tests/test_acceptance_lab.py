"""The acceptance lab's measurement (mars.evaluation.acceptance_lab) against slow obvious references on a tiny
model: every draft equals the one a plain uncached forward of prompt + answer[:f] + B-1 masks gives; the bare
variant equals the model loaded without its adapter; the analysis' numbers equal loops written out."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from mars.decoding.decoder import DecodeConfig, DecodeControl, encode_prompt, generate_ids
from mars.evaluation import acceptance_lab as lab
from mars.models.loading import load
from tiny import random_lora

PROMPTS = ["what is the capital of france ?", "add 2 + 3 = ?", "tell me a word about the water",
           "the old man and the sea"]


@pytest.fixture(scope="module")
def pair(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gated") / "adapter"
    bare = load(str(tiny_dir), dtype="float64")
    random_lora(load(str(tiny_dir), dtype="float64").model).save_pretrained(out, safe_serialization=True)
    (out / "mars.json").write_text(json.dumps({"gated": True, "block_size": 4, "mask_token": "<|mask|>",
                                               "base_model": str(tiny_dir)}))
    return bare, load(str(tiny_dir), adapter=str(out), dtype="float64")


def answers_of(lm, n=24, prompts=PROMPTS):
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    runs = generate_ids(lm, ids, DecodeConfig(mode="ar", block_size=1, max_new_tokens=n, backend="hf"))
    return [lab.Answer(p, i, r.token_ids, r.finish_reason == "eos") for p, i, r in zip(prompts, ids, runs)]


def reference_drafts(lm, answers, B):
    """Slow and obvious: per answer and frontier f, one uncached causal forward of prompt + answer[:f] + B-1
    masks (exactly a decoding pass's input); (example, frontier, depth) -> (draft, confidence)."""
    out = {}
    for e, a in enumerate(answers):
        for f in range(len(a.answer_ids)):
            ids = list(a.prompt_ids) + list(a.answer_ids[:f]) + [lm.mask_token_id] * (B - 1)
            with torch.inference_mode():
                logits = lm.model(torch.tensor([ids])).logits[0].double()
            n = len(a.prompt_ids) + f
            for j in range(1, B):
                if f + j < len(a.answer_ids):
                    p = torch.softmax(logits[n + j - 1], -1)
                    out[(e, f, j)] = (int(p.argmax()), float(p.max()))
    return out


def as_dict(d: lab.Drafts):
    return {(int(e), int(f), int(j)): (int(p), float(c)) for e, f, j, p, c in
            zip(d.example, d.frontier, d.depth, d.pred, d.conf)}


def measure(lm, answers, B, variants, **kw):
    *_, (done, total, found) = lab.teacher_forced(lm, answers, B, variants, backend="hf", **kw)
    assert done == total and found is not None
    return found


@pytest.mark.parametrize("rows_per_forward", [16, 1 << 20])
def test_packed_drafts_equal_one_uncached_forward_per_frontier(pair, rows_per_forward):
    bare, gated = pair
    answers = answers_of(gated)
    assert sum(len(a.answer_ids) > 8 for a in answers) >= 2  # answers of several lengths, some long
    found = measure(gated, answers, 4, ("model", "bare"), rows_per_forward=rows_per_forward)
    for variant, lm in (("model", gated), ("bare", bare)):  # bare: the model loaded without the adapter
        got, want = as_dict(found[variant]), reference_drafts(lm, answers, 4)
        assert got.keys() == want.keys()
        assert all(got[k][0] == want[k][0] for k in want), variant
        assert max(abs(got[k][1] - want[k][1]) for k in want) < 1e-5, variant
    # the adapter changed the drafts (else the comparison would show nothing) and left the answers alone
    assert as_dict(found["model"]) != as_dict(found["bare"])
    assert [a.answer_ids for a in answers_of(bare)] == [a.answer_ids for a in answers]


def test_the_fast_backend_measures_what_transformers_measures(pair):
    _, gated = pair
    answers = answers_of(gated, 16)
    *_, (_, _, fast) = lab.teacher_forced(gated, answers, 3, ("model", "bare"), backend="fast", rows_per_forward=40)
    hf = measure(gated, answers, 3, ("model", "bare"))
    for v in ("model", "bare"):
        a, b = as_dict(fast[v]), as_dict(hf[v])
        assert a.keys() == b.keys() and all(a[k][0] == b[k][0] for k in a)
        assert max(abs(a[k][1] - b[k][1]) for k in a) < 1e-4


class NoGather:
    """A runner without `gather` (as the static backend): the answers' columns stay where their steps put them."""

    def __init__(self, runner):
        self.runner, self.scoring = runner, getattr(runner, "scoring", None)

    @property
    def length(self):
        return self.runner.length

    def forward(self, *args):
        return self.runner.forward(*args)

    def truncate(self, n):
        self.runner.truncate(n)


def lab_answers(lm, answers, backend, reuse=(), max_new=24, control=None, run=None, gather=True):
    """The lab's own greedy answers (greedy_answers) for `answers`' prompts, the ones in `reuse` taken as given:
    (their Answers, the CleanKV, the steps' progress)."""
    from mars.runtime.backends import make_backend

    known = [list(a.prompt_ids) + (list(a.answer_ids[:-1]) if e in reuse else []) for e, a in enumerate(answers)]
    todo = [e for e in range(len(answers)) if e not in reuse]
    runner = make_backend(lm.model, backend, 1, 64)  # small: the cache grows as it must
    runner = runner if gather else NoGather(runner)
    steps = lab.greedy_answers(lm, known, todo, max_new, runner, run, control)
    progress = []
    while True:
        try:
            progress.append(next(steps))
        except StopIteration as stop:
            got = stop.value
            break
    if got is None:
        return None, None, progress
    tokens, eos_at, clean = got
    out = [a if e in reuse else lab.Answer(a.prompt, a.prompt_ids, tokens[e], eos_at[e]) for e, a in enumerate(answers)]
    return out, clean, progress


@pytest.mark.parametrize("backend,gather", [("hf", True), ("fast", True), ("fast-int8", True), ("fast-int8", False)])
def test_the_answers_kv_serves_the_drafts_as_a_clean_forward_would(pair, backend, gather):
    """greedy_answers gives the decoder's AR text on the same backend, and the drafts read from the answers' own
    KV (no clean forward) equal the drafts over a clean forward of their own: bit for bit on the int8 C
    layers, whose attention reads a row's allowed keys in order wherever they sit; to rounding elsewhere.
    One answer is reused (its tokens given, not generated), and the packs are small, so several mask forwards
    read the one clean cache in turn. Without `gather` each answer's columns stay interleaved, step by step."""
    _, gated = pair
    prompts = PROMPTS + ["a list of three colours", "count from one to ten"]
    ids = [encode_prompt(gated.tokenizer, p) for p in prompts]
    runs = generate_ids(gated, ids, DecodeConfig(mode="ar", block_size=1, max_new_tokens=24, backend=backend))
    want = [lab.Answer(p, i, r.token_ids, r.finish_reason == "eos") for p, i, r in zip(prompts, ids, runs)]
    assert len({len(a.answer_ids) for a in want}) > 1  # answers of several lengths: some end early
    got, clean, progress = lab_answers(gated, want, backend, reuse={2}, gather=gather)
    assert [(a.answer_ids, a.finished) for a in got] == [(a.answer_ids, a.finished) for a in want]
    assert [p.done for p in progress] == list(range(1, len(progress) + 1)) and progress[-1].stage == "answers"
    assert clean.length == clean.runner.length == sum(len(a.prompt_ids) + len(a.answer_ids) - 1 for a in want)
    side_by_side = [c for cs in clean.cols for c in cs] == list(range(clean.length))
    assert side_by_side == gather and sorted(c for cs in clean.cols for c in cs) == list(range(clean.length))
    kw = dict(backend=backend, rows_per_forward=16)
    *_, (done, total, kept) = lab.teacher_forced(gated, got, 4, ("model", "bare"), clean=clean, **kw)
    assert done == total == 2 * len(lab.packs(got, 4, 16)) > 4 and clean.runner.length == clean.length
    *_, (_, _, fresh) = lab.teacher_forced(gated, got, 4, ("model", "bare"), **kw)
    for v in ("model", "bare"):
        a, b = kept[v], fresh[v]
        assert torch.equal(a.example, b.example) and torch.equal(a.frontier, b.frontier)
        assert torch.equal(a.pred, b.pred)
        if backend == "fast-int8":
            assert torch.equal(a.conf, b.conf)
        else:
            assert torch.allclose(a.conf, b.conf, atol=1e-9)


def stopping_run(after: int):
    """(run, control, calls): a model-thread stand-in that records each call and presses Stop during call `after`."""
    control, calls = DecodeControl(), []

    def run(fn, *args):
        calls.append(fn)
        if len(calls) == after:
            control.cancel()
        return fn(*args)

    return run, control, calls


def test_stop_ends_the_answers_within_a_step(pair):
    _, gated = pair
    run, control, calls = stopping_run(3)
    answers, clean, progress = lab_answers(gated, answers_of(gated), "hf", control=control, run=run)
    # the forward the Stop came in is the last one: its tokens are reported, no forward follows, nothing returned
    assert answers is None and clean is None and len(calls) == 3 and len(progress) == 3
    ids = [encode_prompt(gated.tokenizer, p) for p in PROMPTS]
    run, control, calls = stopping_run(3)
    events = list(lab.run_lab(gated, PROMPTS, ids, lab.LabConfig(max_new_tokens=24, taus=(), backend="hf"), run=run,
                              control=control))
    assert len(calls) == 3 and [e.stage for e in events] == ["answers"] * 3  # and no result


def test_stop_ends_the_measurement_between_forwards(pair):
    _, gated = pair
    run, control, calls = stopping_run(2)
    out = list(lab.teacher_forced(gated, answers_of(gated), 4, ("model", "bare"), backend="hf", run=run,
                                  control=control, rows_per_forward=16))
    assert len(calls) == 2 and all(found is None for _, _, found in out)


def test_reliability_and_ece_equal_a_loop_over_the_drafts():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(500, generator=g)
    conf[:5] = torch.tensor([0.0, 1.0, 0.1, 0.9999, 0.5])  # the edges: 1.0 falls in the last bin
    right = torch.rand(500, generator=g) < conf
    table, ece = lab.reliability(conf, right, 10)
    want = 0.0
    for b, row in enumerate(table):
        sel = [i for i in range(500) if b / 10 <= conf[i] < (b + 1) / 10 or (b == 9 and conf[i] == 1.0)]
        assert row["count"] == len(sel)
        c = sum(float(conf[i]) for i in sel) / len(sel)
        a = sum(bool(right[i]) for i in sel) / len(sel)
        assert row["confidence"] == pytest.approx(c) and row["accuracy"] == pytest.approx(a)
        want += len(sel) / 500 * abs(a - c)
    assert sum(r["count"] for r in table) == 500 and ece == pytest.approx(want)


def test_predicted_tokens_per_pass_is_the_decoders_rule_pass_by_pass(pair):
    """Each position's accepted count is acceptance.accept_length (the decoder's host rule, repeat guard
    included) on [AR token, drafts]; `predicted` is their mean, `walk` follows them along each answer."""
    from mars.decoding.acceptance import accept_length, repeat_flags_list

    _, gated = pair
    answers = answers_of(gated)
    d = measure(gated, answers, 4, ("model",))["model"]
    by = as_dict(d)
    taus = [1.0, 0.5, 0.2, 0.1, 0.05, 0.0]
    for row in lab.predicted_tokens_per_pass(d, answers, taus, repeat_tau=1.0):
        counts, passes, tokens = [], 0, 0
        for e, a in enumerate(answers):
            n_at = []
            for f in range(len(a.answer_ids)):
                drafts = [by[(e, f, j)] for j in range(1, 4) if (e, f, j) in by]
                props = [a.answer_ids[f]] + [p for p, _ in drafts]
                flags = repeat_flags_list(list(a.prompt_ids) + list(a.answer_ids[:f]), props)
                n_at.append(accept_length([1.0] + [c for _, c in drafts], row["tau"], None, flags, 1.0))
            counts += n_at
            f = 0
            while f < len(n_at):
                f += n_at[f]
                passes += 1
            tokens += len(a.answer_ids)
        assert row["predicted"] == pytest.approx(sum(counts) / len(counts))
        assert row["walk"] == pytest.approx(tokens / passes)
        if row["tau"] == 1.0:
            assert row["predicted"] == 1.0 and row["reach"] == [0.0, 0.0, 0.0]
    low = lab.predicted_tokens_per_pass(d, answers, [0.0])[0]
    assert low["predicted"] > 1.5  # tau 0 takes every draft the repeat guard lets through


@pytest.mark.parametrize("piece, before, want", [
    (" Paris", "in", "word start"), ("Paris", "", "word start"), ("ris", "Pa", "word piece"),
    ("ing", " runn", "word piece"), (" 42", "is", "number"), ("3.14", " ", "number"), (",", "a", "punctuation"),
    ("?", "a", "punctuation"), (" (", "a", "punctuation"), ("{", ") ", "code symbol"), (" ==", "x", "code symbol"),
    ("_", "a", "code symbol"), ("\n", ".", "other"), (" ", "a", "other"), ("word", "(", "word start"),
])
def test_token_classes_from_the_tokens_text(piece, before, want):
    assert lab.token_class(piece, before) == want


def test_special_tokens_are_other_and_pieces_join_to_the_text(pair):
    _, gated = pair
    tok = gated.tokenizer
    ids = tok("the capital of france is paris .", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pieces = lab.token_pieces(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    (_, classes), = lab.answer_texts(tok, [lab.Answer("p", [1], ids)])
    assert classes[0] == "word start" and classes[-2] == "punctuation" and classes[-1] == "other"


def test_analysis_tables_hold_the_extremes(pair):
    _, gated = pair
    answers = answers_of(gated)
    d = measure(gated, answers, 4, ("model",))["model"]
    tau = 0.15
    a = lab.analyse(d, answers, gated.tokenizer, tau=tau, taus=[0.5])
    assert a["drafts"] == len(d.conf) == sum(x["count"] for x in a["depths"]) == sum(c["count"] for c in a["classes"])
    wrong = sorted((float(c) for c, r in zip(d.conf, d.right) if not r), reverse=True)[:lab.TOP]
    assert [r["confidence"] for r in a["confident_wrong"]] == pytest.approx(wrong)
    under = sorted((float(c) for c, r in zip(d.conf, d.right) if r and c < tau), reverse=True)[:lab.TOP]
    assert [r["confidence"] for r in a["right_under_tau"]] == pytest.approx(under)
    for r in a["confident_wrong"]:
        ans = answers[r["prompt_index"]]
        assert r["draft"] != r["right"]
        assert r["right"] == lab.token_pieces(gated.tokenizer, ans.answer_ids)[r["position"] + r["depth"]]
    for x in a["depths"]:
        sel = d.depth == x["depth"]
        assert x["accuracy"] == pytest.approx(float(d.right[sel].double().mean()))
        assert x["confidence"] == pytest.approx(float(d.conf[sel].double().mean()))
    assert any(t["tau"] == 0.5 for t in a["tokens_per_pass"])


def test_run_lab_end_to_end_and_its_files(pair):
    _, gated = pair
    prompts = PROMPTS[:3]
    ids = [encode_prompt(gated.tokenizer, p) for p in prompts]
    cfg = lab.LabConfig(block_size=4, max_new_tokens=16, tau=0.5, taus=(0.5, 0.1), backend="hf")
    reuse = {prompts[0]: {"ids": answers_of(gated, 16, prompts[:1])[0].answer_ids, "finished": True}}
    events = list(lab.run_lab(gated, prompts, ids, cfg, reuse=reuse))
    assert [e.stage for e in events][-1] == "done"
    assert {e.stage for e in events} == {"answers", "drafts", "analysed", "decoding", "done"}
    result = events[-1].result
    assert set(result["variants"]) == {"model", "bare"}
    assert [a["reused"] for a in result["answers"]] == [True, False, False]
    assert [m["tau"] for m in result["measured"]] == [0.5, 0.1]
    m = result["measured"][1]
    assert m["gap"] == pytest.approx(m["tokens_per_pass"] - m["predicted"])
    # measured = the sweep's own decoding of the same prompts, one at a time here
    runs = generate_ids(gated, ids, DecodeConfig(mode="mars", tau=0.1, block_size=4, max_new_tokens=16, backend="hf"))
    assert m["tokens_per_pass"] == pytest.approx(sum(r.tokens for r in runs) / sum(r.passes for r in runs))
    back = json.loads(json.dumps(result))
    assert back["variants"]["model"]["depths"][0]["count"] > 0
    rows = list(csv.DictReader(io.StringIO(lab.to_csv(result))))
    assert {r["table"] for r in rows} >= {"summary", "depth", "reliability", "predicted_tokens_per_pass", "class",
                                          "measured_tokens_per_pass"}
    depth1 = [r for r in rows if r["table"] == "depth" and r["variant"] == "bare" and r["depth"] == "1"][0]
    assert float(depth1["accuracy"]) == pytest.approx(result["variants"]["bare"]["depths"][0]["accuracy"])


def test_a_model_without_gated_adapter_measures_what_it_has(tiny_lm):
    cfg = lab.LabConfig(max_new_tokens=8, taus=())
    assert lab.variants_of(tiny_lm, cfg) == ("model",)
    with pytest.raises(ValueError, match="gated adapter"):
        lab.variants_of(tiny_lm, lab.LabConfig(bare_only=True))
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS[:2]]
    result = list(lab.run_lab(tiny_lm, PROMPTS[:2], ids, lab.LabConfig(max_new_tokens=8, taus=(), backend="hf")))[-1]
    assert list(result.result["variants"]) == ["model"] and result.result["measured"] == []


def test_the_backends_one_call_scoring_gives_what_softmax_gives():
    from mars.runtime.scoring import C_SCORING

    logits = torch.randn(300, 997, generator=torch.Generator().manual_seed(3)) * 4
    depths = torch.randint(1, 4, (300,))
    fast, slow = lab.score(logits, depths, None, C_SCORING), lab.score(logits, depths)
    assert torch.equal(fast[0], slow[0]) and torch.allclose(fast[1], slow[1], atol=1e-6)
    calibrated = lab.score(logits, depths, [2.0, 0.5], C_SCORING)  # temperatures: the softmax path
    p = torch.softmax(logits / torch.tensor([1.0, 2.0, 0.5, 1.0])[depths][:, None], -1)
    assert torch.equal(calibrated[0], p.argmax(-1)) and torch.allclose(calibrated[1], p.max(-1).values, atol=1e-6)
