"""The Batch tab and the paper-checkpoint list as Gradio pieces: their components, and their handlers run
directly with the tiny model (the browser flow is for the app once they are wired)."""

from __future__ import annotations

import json
import threading

import gradio as gr
import pytest

from mars.app import tabs
from mars.app.accept_tab import AcceptSession
from mars.decoding.decoder import DecodeControl

PROMPTS = "what is the capital of france ?\n\ntell me a word\nadd 2 + 3 = ?"


def test_both_pieces_build_with_their_element_ids(tiny_lm):
    with gr.Blocks() as demo:
        with gr.Tab("Batch"):
            batch = tabs.build_batch_tab(lambda: tiny_lm, threading.Lock())
        with gr.Tab("Model"):
            models = tabs.build_model_list(lambda lm: None)
    ids = {c.get("props", {}).get("elem_id") for c in demo.config["components"]}
    for elem in ("batch-prompts", "batch-run", "batch-stop", "batch-output", "batch-chart", "batch-compare",
                 "batch-download-html", "batch-download-json", "batch-cache-block", "paper-checkpoint",
                 "load-paper", "paper-message"):
        assert elem in ids, elem
    assert models.dropdown.value == "smollm2" and batch.prompts.value.count("\n") == 3


def run_all(runner, *args):
    return list(runner(*args))


def test_batch_runner_streams_rows_then_the_comparison_then_the_files(tiny_lm):
    lock = threading.Lock()
    runner = tabs.make_batch_runner(lambda: tiny_lm, lock)
    session = tabs.BatchSession()
    outs = run_all(runner, PROMPTS, 0.1, 4, 24, 4, "time", session)
    rows_html = [o[0] for o in outs if isinstance(o[0], str)]
    assert len(rows_html) >= 3 and all(h.count('class="mars-row"') == 3 for h in rows_html)
    assert 'data-state="running"' in rows_html[0] and 'data-state="done"' in rows_html[-1]
    compares = [o[2] for o in outs if isinstance(o[2], str)]
    assert 'data-complete="true"' in compares[-1] and 'data-same-as-alone="true"' in compares[-1]
    html_file, json_file = outs[-1][3]["value"], outs[-1][4]["value"]
    assert outs[-1][3]["interactive"] and outs[-1][1].data  # the final timeline is drawn
    page = open(html_file, encoding="utf-8").read()
    assert page.count('class="mars-row"') == 3 and "batch-compare-table" in page
    trace = json.load(open(json_file, encoding="utf-8"))
    assert "forward" not in json.dumps(trace)  # the one vocabulary: passes, tokens per pass
    assert trace["batch"]["batch_passes"] == len(trace["batch"]["pass_seconds"])
    assert [r["tokens_per_pass"] for r in trace["comparison"]["runs"]][2] == 1.0  # AR
    assert [r["prompt"] for r in trace["batch"]["rows"]] == PROMPTS.replace("\n\n", "\n").split("\n")
    assert [r["label"] for r in trace["comparison"]["runs"]] == ["MARS batch of 3", "MARS one at a time",
                                                                 "AR batch of 3"]
    assert trace["model"]["model"] == "tiny-llama" and not lock.locked()
    folder = session.folder
    session.close()
    import os

    assert not os.path.exists(folder)


@pytest.mark.parametrize("text,message", [("", "no prompts"), ("a\n" * 9, "at most 8"),
                                          ("ok\n" + "x" * 100_000, "line 2: the prompt is too long")])
def test_bad_batch_input_gets_one_clear_message(tiny_lm, text, message):
    runner = tabs.make_batch_runner(lambda: tiny_lm)
    with pytest.raises(gr.Error, match=message) as err:
        run_all(runner, text, 0.9, 4, 16, 16, "time", tabs.BatchSession())
    assert err.value.print_exception is False  # a refused input prints no traceback in the server log
    with pytest.raises(gr.Error, match="block size"):
        run_all(runner, "hi", 0.9, 99, 16, 16, "time", tabs.BatchSession())


def test_a_failed_batch_logs_the_frames_that_failed(tiny_lm, monkeypatch, caplog):
    def broken_batch(*a, **k):
        raise RuntimeError("kaput")
        yield

    monkeypatch.setattr(tabs, "run_batch", broken_batch)
    with pytest.raises(gr.Error, match="The batch run failed: RuntimeError: kaput") as err:
        run_all(tabs.make_batch_runner(lambda: tiny_lm), "hi", 0.9, 4, 16, 16, "time", tabs.BatchSession())
    # logged once with its own traceback (Gradio's print of the gr.Error raised `from None` showed neither)
    assert err.value.print_exception is False and "broken_batch" in caplog.text
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [("kaput",)]


def test_stop_ends_the_batch_and_skips_the_comparison(tiny_lm):
    runner = tabs.make_batch_runner(lambda: tiny_lm)
    session = tabs.BatchSession()
    outs = []
    for out in runner(PROMPTS, 0.9, 4, 64, 16, "pass", session):
        outs.append(out)
        if len(outs) == 2:
            session.stop()
    assert "stopped: no comparison" in outs[-1][2]
    assert "cancelled" in outs[-1][0]  # the rows say how they ended


def test_paper_checkpoint_loader_installs_or_explains(tiny_lm, monkeypatch):
    installed, seen = [], []
    monkeypatch.setattr(tabs, "load_checkpoint",
                        lambda hub_id, progress: (progress(1.0, "loaded"), (tiny_lm, f"Loaded {hub_id}."))[1])
    load = tabs.make_model_loader(installed.append)
    html = load("Xalphinions/MARS-Qwen2.5-0.5B-blk4", progress=lambda f, desc: seen.append((f, desc)))
    assert installed == [tiny_lm] and seen == [(1.0, "loaded")]
    assert html == '<div class="mars-note">Loaded Xalphinions/MARS-Qwen2.5-0.5B-blk4.</div>'

    def broken(lm):
        raise RuntimeError("first pass failed")

    html = tabs.make_model_loader(broken)("x", progress=lambda f, desc: None)
    assert "Could not run tiny-llama: RuntimeError: first pass failed" in html and "mars-banner" in html
    monkeypatch.setattr(tabs, "load_checkpoint", lambda hub_id, progress: (None, "<b>cannot</b> be reached"))
    html = tabs.make_model_loader(installed.append)("x", progress=lambda f, desc: None)
    assert "&lt;b&gt;cannot&lt;/b&gt; be reached" in html and len(installed) == 1


def test_model_panel_names_what_int8_runs_on(ui, monkeypatch, env):
    """The backend row says whether int8 runs on the C kernels (and which ISA) or on the tensor fallback, and why."""
    from mars.runtime import kernels

    env.unset("MARS_BACKEND")  # the app's default, auto-int8: fast-int8 on a CPU
    _, table, *_ = ui.model_info()
    assert "fast-int8" in table and f"int8 runs on {kernels.status()}" in table
    env.set("MARS_C_KERNELS", "0")
    _, table, *_ = ui.model_info()
    assert "int8 runs on tensor fallback: MARS_C_KERNELS=0" in table


def test_model_panel_shows_the_table_that_cuts_trees_and_none_under_tree_cut_0(ui, lm, monkeypatch, env):
    """The "tree size" row reads the served backend's table through the same gate as every run
    (inputs.app_cut_costs): under MARS_TREE_CUT=0 no table cuts a tree, so the panel names none."""
    from mars.app.inputs import app_backend
    from mars.decoding.costs import PassCosts
    from mars.runtime.backends import resolve_backend

    env.unset("MARS_BACKEND")
    served = resolve_backend(ui.holder.get().model, app_backend())
    monkeypatch.setattr(lm, "pass_costs", {"other": PassCosts((1.0, 9.0), 0.5), served: PassCosts((1.0, 1.25), 0.1)})
    _, table, *_ = ui.model_info()
    assert "tree size" in table and "+25% of a one-input pass" in table and "+10% on top" in table
    env.set("MARS_TREE_CUT", "0")
    _, table, *_ = ui.model_info()
    assert "tree size" not in table


def test_model_panel_says_when_the_tree_size_table_was_measured_and_why_again(ui, lm, monkeypatch, env):
    """The browser review: the row said "measured at start-up" of a table the cost keeper had measured again 20
    minutes later. It says the time of the warm-up's measurement, or of the keeper's, and the keeper's reason."""
    from mars.app.inputs import app_backend
    from mars.decoding.costs import PassCosts
    from mars.runtime.backends import resolve_backend

    env.unset("MARS_BACKEND")
    served = resolve_backend(ui.holder.get().model, app_backend())
    monkeypatch.setattr(lm, "pass_costs", {served: PassCosts((1.0, 1.16), 0.1)})
    keeper = ui.holder.costs
    monkeypatch.setattr(keeper, "wall", lambda: 9 * 3600 + 5 * 60)  # 09:05 UTC
    keeper.measured(served)
    _, table, *_ = ui.model_info()
    assert "measured when the model was loaded, 09:05 UTC (0 min ago): an input more costs +16%" in table
    assert "start-up" not in table
    keeper.measured(served, "the table is 1800 s old")
    monkeypatch.setattr(keeper, "wall", lambda: 9 * 3600 + 25 * 60)
    _, table, *_ = ui.model_info()
    assert "re-measured at 09:05 UTC (20 min ago), because the table is 1800 s old: an input more" in table


@pytest.mark.parametrize("make", [tabs.BatchSession, AcceptSession])
def test_a_tab_session_stops_its_run_and_keeps_one_folder_until_the_visitor_leaves(make):
    import os

    session = make()
    session.stop()  # nothing running: nothing to stop
    control = session.control = DecodeControl()
    session.stop()
    assert control.cancelled
    first = session.new_folder("mars-test-")
    (first / "a.json").write_text("{}")
    second = session.new_folder("mars-test-")  # a new run's files replace the last run's
    assert not first.exists() and second.is_dir() and session.folder == str(second)
    session.control = DecodeControl()
    session.close()  # gradio's delete_callback: the run ends, the files go
    assert session.control.cancelled and not os.path.exists(second) and session.folder is None
    session.close()  # twice is harmless
