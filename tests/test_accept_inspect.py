"""A row of the Acceptance table opened in the pass inspector (mars.app.accept_inspect), on the tiny models: the
pass decoded there shows, at the row's mask, the very draft and confidence the lab measured teacher-forced (its
masks see the prompt and answer[:f], as the lab's group did); every mask of that pass equals the lab's drafts
at that frontier, for the adapter and for the bare model; a key that names no current row gets one message;
the handler runs its pass through the model slot and the app opens the Generate tab on it."""

from __future__ import annotations

import json
import re

import gradio as gr
import pytest

from mars.app import accept_viz, viz
from mars.app.accept_inspect import KINDS, case_key, case_pass, find_case, keep_cases, render_case_html
from mars.app.accept_tab import AcceptSession, make_accept_runner, make_case_inspector
from mars.decoding.decoder import encode_prompt
from mars.evaluation import acceptance_lab as lab

PROMPTS = ["what is the capital of france ?", "add 2 + 3 = ?", "tell me a word about the water"]
B = 4


def run_lab(lm, tau=0.5, backend="hf", max_new_tokens=16, variants_compare=False):
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
    cfg = lab.LabConfig(block_size=B, max_new_tokens=max_new_tokens, tau=tau, taus=(), compare=variants_compare,
                        backend=backend)
    *_, last = lab.run_lab(lm, PROMPTS, ids, cfg)
    assert last.stage == "done" and last.answers is not None
    return last.result, last.answers


def proposals(rec):
    return list(rec.token_ids) + list(rec.rejected_token_ids), list(rec.confidences) + list(rec.rejected_confidences)


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_every_table_row_opens_a_pass_showing_the_rows_draft_and_confidence(tiny_lm, backend):
    result, answers = run_lab(tiny_lm, backend=backend)
    cases = keep_cases(1, tiny_lm, result, answers)
    seen = 0
    for kind in KINDS:
        for i, row in enumerate(result["variants"]["model"][kind]):
            got_kind, got_row, answer = find_case(cases, case_key(1, kind, i), tiny_lm)
            assert (got_kind, got_row) == (kind, row) and answer.prompt == row["prompt"]
            f, j = row["position"], row["depth"]
            rec = case_pass(tiny_lm, answer, f, B, 0.5, backend=backend)
            toks, confs = proposals(rec)
            assert len(toks) == B and toks[0] == answer.answer_ids[f]  # the AR token: the greedy answer's own
            assert tiny_lm.tokenizer.decode([toks[j]]) == row["draft"]
            assert confs[j] == pytest.approx(row["confidence"], abs=1e-5)
            # the inspector shows the table's token and confidence on the marked row, and only there
            html = render_case_html(rec, row, kind, answer, tiny_lm.tokenizer, B)
            marked = re.findall(r'<tr class="mars-case" data-case="1"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>',
                                html)
            assert marked == [(f"mask +{j}", viz.esc(viz.token_label(row["draft"])), f"{row['confidence']:.3f}")]
            assert html.count("mars-case\"") == 1 and f'data-position="{f}"' in html
            if kind == "right_under_tau":  # under the lab's tau: never accepted at that tau
                assert j >= len(rec.token_ids)
            seen += 1
    assert seen >= 10  # both lists had rows to check


@pytest.fixture(scope="module")
def gated_pair(tiny_dir, tmp_path_factory):
    from mars.models.loading import load
    from tiny import random_lora

    out = tmp_path_factory.mktemp("gated") / "adapter"
    random_lora(load(str(tiny_dir), dtype="float64").model).save_pretrained(out, safe_serialization=True)
    (out / "mars.json").write_text(json.dumps({"gated": True, "block_size": B, "mask_token": "<|mask|>",
                                               "base_model": str(tiny_dir)}))
    return load(str(tiny_dir), dtype="float64"), load(str(tiny_dir), adapter=str(out), dtype="float64")


@pytest.mark.parametrize("variant", ["model", "bare"])
def test_the_passes_masks_are_the_labs_drafts_at_that_frontier(gated_pair, variant):
    """Every mask of the decoded pass, not only the row's: the token ids and confidences of the lab's Drafts."""
    bare, gated = gated_pair
    ids = [encode_prompt(gated.tokenizer, p) for p in PROMPTS]
    *_, last = lab.run_lab(gated, PROMPTS, ids, lab.LabConfig(block_size=B, max_new_tokens=12, taus=(), backend="hf"))
    answers = last.answers
    *_, (_, _, drafts) = lab.teacher_forced(gated, answers, B, (variant,), backend="hf")
    d = drafts[variant]
    want = {(int(e), int(f), int(j)): (int(p), float(c)) for e, f, j, p, c in
            zip(d.example, d.frontier, d.depth, d.pred, d.conf)}
    checked = 0
    for e, a in enumerate(answers):
        for f in range(0, len(a.answer_ids) - 1, 3):
            toks, confs = proposals(case_pass(gated, a, f, B, 0.9, variant=variant, backend="hf"))
            for j in range(1, B):
                if f + j < len(a.answer_ids):
                    assert toks[j] == want[(e, f, j)][0]
                    assert confs[j] == pytest.approx(want[(e, f, j)][1], abs=1e-6)
                    checked += 1
    assert checked > 20
    if variant == "bare":  # closing the adapter is what the bare model loaded alone gives
        a = answers[0]
        assert proposals(case_pass(gated, a, 2, B, 0.9, variant="bare", backend="hf"))[0] == \
            proposals(case_pass(bare, a, 2, B, 0.9, backend="hf"))[0]


def test_a_key_that_names_no_current_row_gets_one_message(tiny_lm):
    result, answers = run_lab(tiny_lm, max_new_tokens=8)
    cases = keep_cases(3, tiny_lm, result, answers)
    with pytest.raises(ValueError, match="no lab run to inspect yet"):
        find_case(None, case_key(3, "confident_wrong", 0), tiny_lm)
    for bad in (None, "", "3:confident_wrong", "3:other:0", "x:confident_wrong:0", "3:confident_wrong:-1",
                "3:confident_wrong:0<script>", 7):
        with pytest.raises(ValueError, match="not a row of the lab's table"):
            find_case(cases, bad, tiny_lm)
    with pytest.raises(ValueError, match="not a row of the lab's table: confident_wrong has"):
        find_case(cases, case_key(3, "confident_wrong", 99), tiny_lm)
    with pytest.raises(ValueError, match="earlier lab run"):
        find_case(cases, case_key(2, "confident_wrong", 0), tiny_lm)
    import tiny

    with pytest.raises(ValueError, match="the model has changed since this lab run"):
        find_case(cases, case_key(3, "confident_wrong", 0), tiny.make_loaded("llama"))
    assert find_case(cases, case_key(3, "confident_wrong", 0), tiny_lm)[1] == \
        result["variants"]["model"]["confident_wrong"][0]


def test_the_table_carries_one_inspect_button_per_row_with_its_key():
    from test_accept_app import fake_result

    r = fake_result()
    html = accept_viz.render_table_html(r, "model", run=5)
    assert html.count('class="accept-inspect"') == 1  # one row in all (confident_wrong)
    assert 'id="accept-inspect-confident_wrong-0" data-case="5:confident_wrong:0"' in html
    assert 'colspan="8">none' in html  # the empty list spans the extra column
    assert "accept-inspect" not in accept_viz.render_table_html(r, "model")  # no run: nothing to open


def test_the_inspector_marks_one_row():
    rows = [{"position": p, "token": t, "confidence": c, "status": s, "candidates": []}
            for p, t, c, s in (("AR token (0)", "a", 0.9, "accepted"), ("mask +1", "b", 0.4, "rejected"))]
    html = viz.render_inspector_html(rows, "why", marked=1)
    assert html.count("mars-case") == 1 and html.index("mars-case") > html.index("&#x27;a&#x27;")
    assert "mars-case" not in viz.render_inspector_html(rows, "why")


def test_the_handler_decodes_through_the_slot_and_a_stale_row_gets_a_message(tiny_lm):
    calls = []

    class Slot:
        holder = None

        def run(self, fn, *args):
            calls.append(fn)
            return fn(*args)

    slot = Slot()
    runner, inspect = make_accept_runner(lambda: tiny_lm, slot), make_case_inspector(lambda: tiny_lm, slot)
    session = AcceptSession()
    with pytest.raises(gr.Error, match="no lab run to inspect yet"):
        inspect(0.5, session, "1:confident_wrong:0")
    outs = list(runner("\n".join(PROMPTS), 0.5, B, 12, "", False, session))
    table = outs[-1][5]
    key = re.search(r'data-case="([^"]+)"', table).group(1)
    row = session.cases.rows[key.split(":")[1]][int(key.split(":")[2])]
    before = len(calls)
    html = inspect(0.3, session, key)
    assert len(calls) == before + 1  # the pass: one call on the model thread
    assert f"{row['confidence']:.3f}" in re.search(r'<tr class="mars-case".*?</tr>', html).group(0)
    assert "at tau 0.30" in html
    with pytest.raises(gr.Error, match="tau must be"):
        inspect(1.5, session, key)
    list(runner("\n".join(PROMPTS[:2]), 0.5, B, 8, "", False, session))  # a new run replaces the table
    with pytest.raises(gr.Error, match="earlier lab run"):
        inspect(0.5, session, key)

    class Broken(Slot):
        def run(self, fn, *args):
            raise RuntimeError("the model thread fell over")

    new_key = f"{session.cases.run}:{key.split(':', 1)[1]}"
    with pytest.raises(gr.Error, match="could not be inspected: RuntimeError"):
        make_case_inspector(lambda: tiny_lm, Broken())(0.5, session, new_key)
    assert "mars-case" in inspect(0.5, session, new_key)  # and the next one works
    session.close()
    assert session.cases is None


def test_the_app_opens_the_generate_tab_on_the_rows_pass(ui):
    session = AcceptSession()
    acc = ui.ui.accept
    list(acc.runner("\n".join(PROMPTS[:2]), 0.5, B, 8, "", False, session))
    key = case_key(session.cases.run, "confident_wrong", 0)
    tabs, box, html = ui.inspect_lab_case(0.5, session, gr.EventData(None, {"case": key}))
    assert tabs.selected == "generate" and box.open is True
    assert 'class="mars-case"' in html and "Acceptance lab, prompt" in html
    with pytest.raises(gr.Error, match="not a row"):
        ui.inspect_lab_case(0.5, session, gr.EventData(None, {"nothing": 1}))
