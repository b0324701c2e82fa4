"""The Acceptance tab's pieces without a browser: figure builders on a result whose numbers are known, the
table, the built-in prompt sets (training-side only), input validation, the reuse of the last Generate, the
handler on a tiny model, and `python -m mars accept`."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import gradio as gr
import pytest

from mars.app import accept_viz
from mars.app.accept_tab import (AcceptSession, make_accept_runner, parse_lab_prompts, previous_lab_answers,
                                 reusable_answers)
from mars.evaluation import acceptance_lab as lab
from mars.evaluation.prompt_sets import SETS, SOURCE_KIND

ROOT = Path(__file__).resolve().parent.parent


def fake_result(variants=("model", "bare")) -> dict:
    """A result as run_lab shapes it, with numbers chosen by hand."""
    out = {}
    for k, v in enumerate(variants):
        depths = []
        for j in (1, 2, 3):
            bins = [{"lo": b / 10, "hi": (b + 1) / 10, "count": (b + 1) * j if b % 3 else 0,
                     "confidence": b / 10 + 0.05 if b % 3 else None, "accuracy": (b / 10) * (1 - 0.1 * k) if b % 3 else None}
                    for b in range(10)]
            depths.append({"depth": j, "count": sum(b["count"] for b in bins), "accuracy": 0.8 / j - 0.1 * k,
                           "confidence": 0.85 / j, "ece": 0.01 * j + 0.1 * k, "overconfidence": 0.05, "bins": bins})
        out[v] = {"variant": v, "drafts": 300, "accuracy": 0.5, "confidence": 0.55, "ece": 0.05 + k, "bins": [],
                  "depths": depths,
                  "classes": [{"class": c, "count": 10 * (i + 1), "accuracy": 0.1 * i, "confidence": 0.5,
                               "accepted": 0.05 * i, "accepted_right": 0.04 * i} for i, c in enumerate(lab.CLASSES)],
                  "tokens_per_pass": [{"tau": t / 10, "predicted": 3 - 0.2 * t - k, "walk": 2.9 - 0.2 * t - k,
                                       "reach": [0.5, 0.3, 0.1]} for t in range(11)],
                  "confident_wrong": [{"prompt_index": 0, "prompt": "p<b>", "position": 3, "depth": 2,
                                       "confidence": 0.97, "before": "The <i>capital", "pass": " of",
                                       "draft": " Lyon", "right": " Paris", "class": "word start"}],
                  "right_under_tau": []}
    measured = [{"tau": 0.9, "passes": 40, "tokens": 80, "tokens_per_pass": 2.0, "predicted": 1.2, "walk": 1.1,
                 "gap": 0.8, "seconds": 1.0}]
    return {"settings": {"tau": 0.9, "block_size": 4}, "variants": out, "measured": measured, "answers": []}


def test_reliability_figure_has_a_panel_per_depth_with_the_bins_and_the_diagonal():
    r = fake_result()
    fig = accept_viz.make_reliability_figure(r)
    assert [fig.layout[f"xaxis{k}"].domain is not None for k in ("", "2", "3")] == [True] * 3
    bare2 = [t for t in fig.data if t.name == accept_viz.NAMES["bare"] and t.xaxis == "x2"][0]
    bins = [b for b in r["variants"]["bare"]["depths"][1]["bins"] if b["count"]]
    assert list(bare2.x) == [b["confidence"] for b in bins] and list(bare2.y) == [b["accuracy"] for b in bins]
    assert [c[0] for c in bare2.customdata] == [b["count"] for b in bins]
    assert sum(list(t.x) == [0, 1] and list(t.y) == [0, 1] for t in fig.data) == 3  # one diagonal per panel
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "ECE adapter 0.030, bare 0.130" in texts


def test_depth_tokens_per_pass_and_class_figures_carry_the_numbers():
    r = fake_result()
    depth = accept_viz.make_depth_figure(r)
    acc = [t for t in depth.data if t.name.endswith("right") and t.name.startswith(accept_viz.NAMES["model"])][0]
    assert list(acc.y) == pytest.approx([0.8, 0.4, 0.8 / 3])
    tpp = accept_viz.make_tokens_per_pass_figure(r)
    measured = [t for t in tpp.data if "measured" in t.name][0]
    assert list(measured.x) == [0.9] and list(measured.y) == [2.0] and list(measured.text) == ["+0.80"]
    pred = [t for t in tpp.data if t.name == f'{accept_viz.NAMES["bare"]}: predicted'][0]
    assert list(pred.y) == pytest.approx([2 - 0.2 * t for t in range(11)])
    cls = accept_viz.make_classes_figure(r)
    bars = [t for t in cls.data if t.type == "bar"]
    assert len(bars) == 2 and list(bars[0].x) == list(lab.CLASSES) and list(bars[0].y) == pytest.approx(
        [0.1 * i for i in range(6)])


def test_empty_figures_say_what_to_do():
    for make in (accept_viz.make_reliability_figure, accept_viz.make_depth_figure,
                 accept_viz.make_tokens_per_pass_figure, accept_viz.make_classes_figure):
        fig = make(None)
        assert any(a.text == "press Analyse" for a in fig.layout.annotations)


def test_table_escapes_model_text_and_fills_both_kinds():
    html = accept_viz.render_table_html(fake_result())
    assert "<i>" not in html and "&lt;i&gt;" in html and "&lt;b&gt;" in html
    assert html.count('data-kind="confident_wrong"') == 1 and 'data-table="right_under_tau"' in html
    assert "none" in html  # the empty table says so
    assert "press" not in html and "appear here" in accept_viz.render_table_html(None)


def test_builtin_sets_are_training_side_prompts_by_kind():
    def rows(name):
        return [json.loads(line) for line in (ROOT / "data" / "prompts" / name).read_text().splitlines() if line.strip()]

    train = {(r["kind"], r["prompt"]) for r in rows("train.jsonl")}
    held = {r["prompt"] for r in rows("heldout.jsonl")}
    assert set(SETS) == {"facts", "lists", "code", "stories", "math", "rewrites"}
    for name, prompts in SETS.items():
        assert 1 <= len(prompts) <= lab.MAX_PROMPTS and len(set(prompts)) == len(prompts)
        assert all((SOURCE_KIND[name], p) in train for p in prompts), name
        assert not held & set(prompts), name


@pytest.mark.parametrize("text, message", [
    ("", "no prompts"), ("  \n \n", "no prompts"), (None, "no prompts"),
    ("\n".join(f"q{i}" for i in range(17)), "17 prompts given: the lab takes at most 16"),
    ("ok\n" + "x" * 100_000, "line 2: the prompt is too long"), (3, "must be text"),
])
def test_bad_input_gets_one_message(text, message):
    from mars.app.inputs import check_prompt

    with pytest.raises(ValueError, match=message):
        parse_lab_prompts(text, check_prompt)


def test_sixteen_prompts_pass_and_blank_lines_are_dropped():
    assert parse_lab_prompts("\n".join(f" q{i} " for i in range(16)) + "\n\n") == [f"q{i}" for i in range(16)]


def test_the_last_generate_is_reused_when_it_is_the_greedy_text_of_this_backend():
    from mars.app.session import Session
    from mars.decoding.decoder import DecodeConfig
    from mars.decoding.records import RunRecord

    def run(mode, ids, reason, backend="fast-int8", prompt="q"):
        r = RunRecord(DecodeConfig(mode=mode, block_size=1 if mode == "ar" else 4, backend=backend,
                                   max_new_tokens=len(ids)), [1], prompt=prompt)
        r.token_ids, r.finish_reason, r.finished = list(ids), reason, 1.0
        return r

    s = Session(ar=run("ar", [5, 6, 7], "eos"), mars=run("mars", [5, 9], "eos", prompt="other"))
    assert reusable_answers(s, 128, "fast-int8") == {"q": {"ids": [5, 6, 7], "finished": True}}
    assert reusable_answers(s, 2, "fast-int8") == {"q": {"ids": [5, 6], "finished": False}}  # cut to max new
    assert reusable_answers(s, 128, "hf") == {}  # another backend's greedy text may differ
    s = Session(ar=run("ar", [5, 6], "length"), mars=run("verified", [4, 4, 4], "eos", prompt="v"))
    assert reusable_answers(s, 128, "fast-int8") == {"v": {"ids": [4, 4, 4], "finished": True}}  # "q" was cut short
    s = Session(mars=run("mars", [4], "eos", prompt="m"), ar=run("ar", [1], "cancelled", prompt="c"))
    assert reusable_answers(s, 128, "fast-int8") == {}  # tau-rule text is not greedy; a cancelled run is unfinished


def test_the_last_lab_runs_answers_are_reused_for_this_model_and_backend():
    from types import SimpleNamespace

    from mars.app.accept_inspect import LabCases

    lm, other = SimpleNamespace(), SimpleNamespace()
    answers = [lab.Answer("q", [1], [5, 6, 7, 2], finished=True), lab.Answer("r", [1], [8, 8], finished=False)]
    cases = LabCases(1, lambda: lm, "m", "model", 4, "fast-int8", answers, {})
    assert previous_lab_answers(cases, lm, 2, "fast-int8") == {"q": {"ids": [5, 6], "finished": False},
                                                                 "r": {"ids": [8, 8], "finished": False}}
    # "r" stopped at 2 new tokens: it says nothing about a third
    assert previous_lab_answers(cases, lm, 8, "fast-int8") == {"q": {"ids": [5, 6, 7, 2], "finished": True}}
    assert previous_lab_answers(cases, other, 8, "fast-int8") == {}  # another model
    assert previous_lab_answers(cases, lm, 8, "hf") == {}  # another backend's greedy text may differ
    assert previous_lab_answers(None, lm, 8, "fast-int8") == {}


def test_analysing_again_at_another_b_reuses_the_answers_and_measures_the_same_text(tiny_lm):
    runner = make_accept_runner(lambda: tiny_lm)
    session = AcceptSession()
    prompts = "what is the capital of france ?\nadd 2 + 3 = ?"

    def answers(block_size, max_new):
        last = list(runner(prompts, 0.5, block_size, max_new, "", False, session))[-1]
        return json.loads(Path(last[6]["value"]).read_text())["answers"]

    first = answers(4, 12)
    assert [a["reused"] for a in first] == [False, False]
    again = answers(3, 12)  # another B: the greedy answers are the same, so they are not generated again
    assert [a["reused"] for a in again] == [True, True]
    assert [a["text"] for a in again] == [a["text"] for a in first]
    longer = answers(3, 16)  # longer than those answers could tell (unless they ended): generated again
    assert [a["reused"] for a in longer] == [a["finished"] for a in first]
    session.close()


def test_the_handler_runs_through_the_slot_and_writes_parsing_files(tiny_lm):
    calls = []

    class Slot:
        def run(self, fn, *args):
            calls.append(fn)
            return fn(*args)

    runner = make_accept_runner(lambda: tiny_lm, Slot())
    session = AcceptSession()
    outs = list(runner("what is the capital of france ?\nadd 2 + 3 = ?", 0.5, 4, 12, "0.5", True, session))
    last = outs[-1]
    assert len(last) == 8 and "done" in last[0]
    data = json.loads(Path(last[6]["value"]).read_text())
    assert list(data["variants"]) == ["model"] and [m["tau"] for m in data["measured"]] == [0.5]
    rows = list(csv.DictReader(Path(last[7]["value"]).open()))
    assert rows and rows[0]["table"] == "summary"
    assert len(calls) > 10  # every pass and forward went through the slot
    with pytest.raises(gr.Error, match="at most 16") as err:
        list(runner("\n".join(["hi"] * 17), 0.5, 4, 12, "", True, session))
    assert err.value.print_exception is False  # a refused input: the page says why, the server log nothing
    with pytest.raises(gr.Error, match="taus must be") as err:
        list(runner("hi", 0.5, 4, 12, "x", True, session))
    assert err.value.print_exception is False
    session.close()
    assert session.folder is None


def _page(outs) -> list:
    """What the page shows after a run's updates, applied in order as Gradio does: per output, the last value
    that was not a skip (a download's {"value", "interactive"} update as the dict)."""
    shown = [None] * 8
    for out in outs:
        for i, v in enumerate(out):
            if not (isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1):
                shown[i] = v
    return shown


def has_data(fig) -> bool:
    """Whether a figure draws a run's numbers: a named trace (a variant's, decoding's) with points."""
    return any(t.name and t.x is not None and len(t.x) for t in fig.data)


def test_a_run_stopped_before_its_drafts_shows_no_results_of_the_previous_prompts(tiny_lm):
    """A new run clears the last one's charts, table (its inspect buttons) and downloads at its start: stopped
    before its drafts are measured, the page shows nothing of the previous prompts as this run's, and the old
    table's rows cannot be inspected. The answers of the analysed run are still reused by the next one."""
    from mars.app.accept_tab import make_case_inspector

    runner, inspect = make_accept_runner(lambda: tiny_lm), make_case_inspector(lambda: tiny_lm)
    session = AcceptSession()
    first = list(runner("what is the capital of france ?\nadd 2 + 3 = ?", 0.5, 4, 12, "", False, session))
    old_key = re.search(r'data-case="([^"]+)"', first[-1][5]).group(1)
    assert all(has_data(fig) for fig in _page(first)[1:5]) and "france" in _page(first)[5]
    assert inspect(0.5, session, old_key)  # the old table works until a new run starts

    second = runner("the sky is\nname a colour", 0.5, 4, 12, "", False, session)
    outs = [next(second)]
    session.stop()  # Stop, before any forward of the new run
    outs += list(second)
    page = _page(outs)
    assert "stopped before the drafts were measured" in page[0] and "cleared" in page[0]
    assert "data-case" not in page[5] and "france" not in page[5] and "appear here" in page[5]
    assert page[6] == page[7] == {"__type__": "update", "value": None, "interactive": False}
    for fig in page[1:5]:
        assert not has_data(fig) and "press Analyse" in json.dumps(fig.to_dict()["layout"].get("annotations", []))
    with pytest.raises(gr.Error, match="no lab run to inspect"):
        inspect(0.5, session, old_key)

    third = list(runner("what is the capital of france ?\nadd 2 + 3 = ?", 0.5, 3, 12, "", False, session))
    data = json.loads(Path(_page(third)[6]["value"]).read_text())
    assert [a["reused"] for a in data["answers"]] == [True, True]  # the analysed run's answers, kept for reuse
    session.close()


def test_cli_accept_writes_json_and_csv(tiny_dir, tmp_path, capsys):
    from mars.cli import main

    out = tmp_path / "lab.json"
    rc = main(["accept", "what is the capital of france ?", "add 2 + 3 = ?", "--model", str(tiny_dir),
               "--adapter", "none", "--backend", "hf", "--max-new-tokens", "12", "--taus", "0.5", "--tau", "0.5",
               "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["settings"]["block_size"] == 4 and len(data["answers"]) == 2
    assert data["variants"]["model"]["drafts"] == sum(d["count"] for d in data["variants"]["model"]["depths"])
    err = capsys.readouterr().err
    assert "model:" in err and "measured at tau 0.50" in err
    csv_out = tmp_path / "lab.csv"
    assert main(["accept", "hi there", "--model", str(tiny_dir), "--adapter", "none", "--backend", "hf",
                 "--max-new-tokens", "8", "--taus", "", "--out", str(csv_out)]) == 0
    assert {r["table"] for r in csv.DictReader(csv_out.open())} >= {"summary", "depth", "reliability"}


@pytest.mark.parametrize("args, message", [
    ([], "give 1 to 16"), (["--set", "poems"], "--set must be one of"), (["q"] * 17, "at most 16"),
    (["q", "--out", "x.txt"], "must end in .json or .csv"), (["q", "--bare"], "gated adapter"),
])
def test_cli_accept_bad_input_exits_2_with_one_line(tiny_dir, capsys, args, message):
    from mars.cli import main

    assert main(["accept", *args, "--model", str(tiny_dir), "--adapter", "none", "--backend", "hf",
                 "--max-new-tokens", "4", "--taus", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("error:")


def test_a_lab_that_fails_logs_its_traceback_once_and_the_page_reads_one_sentence(tiny_lm, monkeypatch, caplog):
    """Not the visitor's doing: the frames that failed go to the log once (mars.app.errors.failure_error), and
    Gradio prints no second traceback of its own."""
    from mars.app import accept_tab

    def broken_lab(*a, **k):
        raise RuntimeError("kaput")
        yield

    monkeypatch.setattr(accept_tab, "run_lab", broken_lab)
    with pytest.raises(gr.Error, match="The acceptance lab failed: RuntimeError: kaput") as err:
        list(make_accept_runner(lambda: tiny_lm)("the sky is", 0.5, 4, 12, "", False, AcceptSession()))
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info[1].args == ("kaput",) and "broken_lab" in caplog.text
    assert err.value.print_exception is False
