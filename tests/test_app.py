"""The app's handlers with the tiny model: streaming, live tau, stop, AR comparison, the API, bad input.

Handlers are called directly (they are plain generator functions); one test also serves the app over HTTP
and calls the public `generate` endpoint with gradio_client, and one runs `python app.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import gradio as gr
import pytest

import app as app_module
from mars.app.batching import LOOKAHEAD
from mars.app.inputs import app_backend, app_tree_nodes, mode_block
from mars.app.serving import free_port
from mars.app.serving import load_other
from mars.app.session import Session
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from tiny import save_tiny

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "what is the capital of france ?"



def call_api(ui, *args):
    """What an API client gets: the endpoint is a generator (one yield per pass), the client the last yield."""
    *_, last = ui.api_generate(*args)
    return last

def groups(html: str) -> list[dict]:
    found = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if "mars-group" in a.get("class", ""):
                found.append(a)

    P().feed(html)
    return found


def text_of(html: str) -> str:
    """The text of an HTML fragment (attributes, like the struck drafts' data-draft, are not text)."""
    parts = []

    class P(HTMLParser):
        def handle_data(self, data):
            parts.append(data)

    P().feed(html)
    return "".join(parts)


def run(ui, session, prompt=PROMPT, tau=0.9, block=4, max_new=40, compare=False, confidence="prob",
        mode="MARS (tau rule)"):
    return ui.generate(prompt, tau, block, max_new, confidence, compare, mode, session)


def greedy(lm, prompt, mode, tau=0.9, max_new=40):
    ids = encode_prompt(lm.tokenizer, prompt)
    # the app's backend (MARS_BACKEND, int8 by default on a CPU): the model whose text the app promises
    return generate_ids(lm, [ids], DecodeConfig(mode=mode, tau=tau, max_new_tokens=max_new, backend=app_backend()))[0]


def test_generation_streams_one_update_per_pass(ui, lm, monkeypatch):
    monkeypatch.setattr(ui, "text_every_s", 0.0)
    session = Session()
    counts = [len(groups(u[ui.ui.output])) for u in run(ui, session) if ui.ui.output in u]
    passes = session.mars.passes
    assert passes > 3
    assert counts[0] == 0  # the placeholder that clears the previous run
    assert counts[1:passes + 1] == list(range(1, passes + 1))  # then exactly one more group per forward pass
    expected = greedy(lm, PROMPT, "mars")
    assert session.mars.token_ids == expected.token_ids and session.mars.text == expected.text


def test_text_updates_follow_the_text_interval_first_and_last_pass_at_once(ui, lm, monkeypatch):
    """Passes faster than a page can draw are sent together: with an interval nothing else reaches, the page gets
    the first pass's group at once and then the whole run at its end, each pass still its own group."""
    monkeypatch.setattr(ui, "text_every_s", float("inf"))
    session = Session()
    updates = [u for u in run(ui, session) if ui.ui.output in u]
    passes = session.mars.passes
    assert passes > 3
    assert [len(groups(u[ui.ui.output])) for u in updates] == [0, 1, passes]
    assert ui.ui.stats in updates[1] and ui.ui.stats in updates[2]
    assert session.mars.token_ids == greedy(lm, PROMPT, "mars").token_ids


def test_charts_follow_the_chart_interval_and_the_text_every_pass(ui, monkeypatch):
    monkeypatch.setattr(ui, "text_every_s", 0.0)
    charts = ui.ui.chart_race
    monkeypatch.setattr(ui, "chart_every_s", 0.0)
    updates = list(run(ui, Session()))
    every = [charts in u for u in updates if ui.ui.output in u][1:]
    # interval 0: a redraw with every pass's text, but the last pass's: the run's last update draws them once
    assert len(every) > 3 and all(every[:-1]) and not every[-1] and charts in updates[-1]
    monkeypatch.setattr(ui, "chart_every_s", float("inf"))
    updates = list(run(ui, Session()))
    assert not any(charts in u for u in updates[:-1])  # inf: the text only...
    assert charts in updates[-1]  # ...until the run ends


def test_text_interval_comes_from_mars_text_every_s(env):
    from mars.app.inputs import text_every_s

    env.unset("MARS_TEXT_EVERY_S")
    assert text_every_s() == 0.1
    env.set("MARS_TEXT_EVERY_S", "0")
    assert text_every_s() == 0.0
    for bad in ("-0.1", "nan", "often"):
        env.set("MARS_TEXT_EVERY_S", bad)
        with pytest.raises(ValueError, match="MARS_TEXT_EVERY_S"):
            text_every_s()


def test_a_race_runs_mars_and_ar_one_pass_each_in_turn_and_draws_its_charts_once_both_are_in(ui, monkeypatch):
    """MARS and AR go side by side, one pass of each in turn until MARS ends, then AR alone: whatever else the
    machine does meanwhile falls on both alike (run one after the other, the first run took the event's start on
    its passes). The charts are drawn once both runs are in, not while they run, however short the chart interval
    (drawn mid-race, three figures fell on the next passes: on AR's alone once MARS was done)."""
    monkeypatch.setattr(ui, "text_every_s", 0.0)
    monkeypatch.setattr(ui, "chart_every_s", 0.0)
    order = []
    inner = ui.holder.passes

    def passes(lm, prompt_ids, cfg, control):  # every pass the server runs, in order, by its run's mode
        for rec in inner(lm, prompt_ids, cfg, control):
            order.append(cfg.mode)
            yield rec

    monkeypatch.setattr(ui.holder, "passes", passes)
    session = Session()
    updates = list(run(ui, session, compare=True))
    m, a = session.mars.passes, session.ar.passes
    assert a >= m > 1  # the tiny test model may accept one token a pass
    assert order == ["mars", "ar"] * m + ["ar"] * (a - m)
    ar_updates = [u for u in updates if ui.ui.output_ar in u]
    assert [len(groups(u[ui.ui.output_ar])) for u in ar_updates][1:a + 1] == list(range(1, a + 1))  # each AR pass
    assert not any(ui.ui.chart_race in u for u in updates[:-1])
    assert ui.ui.chart_race in updates[-1]  # drawn once both runs are in


def test_chart_interval_comes_from_mars_chart_every_s(env):
    from mars.app.inputs import chart_every_s

    env.unset("MARS_CHART_EVERY_S")
    assert chart_every_s() == 3.0
    env.set("MARS_CHART_EVERY_S", "inf")
    assert chart_every_s() == float("inf")
    for bad in ("-1", "nan", "soon"):
        env.set("MARS_CHART_EVERY_S", bad)
        with pytest.raises(ValueError, match="MARS_CHART_EVERY_S"):
            chart_every_s()


def test_tau_set_during_a_run_steers_the_next_passes(ui):
    session = Session()
    stream = run(ui, session, tau=0.9)
    next(stream)  # placeholder
    for _ in range(3):
        next(stream)
    ui.set_tau(0.05, session)  # what the slider's change event does
    last = None
    for last in stream:
        pass
    taus = [r.tau for r in session.mars.steps]
    # the pass after the last one read, or the one after it (the server runs a row at most one pass ahead of its
    # reader: batching.LOOKAHEAD); from there on every pass
    first = taus.index(0.05)
    assert taus[:3] == [0.9] * 3 and first <= 3 + LOOKAHEAD and set(taus[:first]) == {0.9} and set(taus[first:]) == {0.05}
    assert groups(ui.inspect(0, session)) == []  # the inspector is a table, not groups
    assert json.loads(Path(last[ui.ui.download_json]["value"]).read_text())["mars"]["steps"][first]["tau"] == 0.05


def test_tau_of_one_session_does_not_touch_another(ui):
    a, b = Session(), Session()
    run_a = run(ui, a)
    next(run_a), next(run_a)
    run_b = run(ui, b)
    next(run_b), next(run_b)
    ui.set_tau(0.2, a)
    assert a.control.tau == 0.2 and b.control.tau == 0.9
    run_a.close(), run_b.close()


def test_stop_ends_the_run_within_one_pass(ui):
    session = Session()
    stream = run(ui, session, compare=True)
    next(stream)
    next(stream), next(stream)
    at_stop = session.mars.passes, session.ar.passes if session.ar else 0
    ui.stop(session)
    updates = list(stream)
    assert session.mars.passes <= at_stop[0] + 1
    assert session.mars.finish_reason == "cancelled"
    assert session.ar is None or (session.ar.passes <= at_stop[1] + 1 and session.ar.finish_reason == "cancelled")
    assert 'data-state="stopped"' in updates[-1][ui.ui.stats]


def test_ar_comparison_runs_beside_mars_on_the_same_core(ui, lm):
    session = Session()
    updates = list(run(ui, session, tau=1.0, compare=True))
    ar, mars = session.ar, session.mars
    assert ar.config.mode == "ar" and all(len(r.token_ids) == 1 for r in ar.steps)
    assert ar.token_ids == greedy(lm, PROMPT, "ar").token_ids
    assert mars.token_ids == ar.token_ids  # tau = 1 is exactly AR
    assert ar.started < mars.finished  # side by side; each pass still runs alone on the model thread, timed alone
    final = updates[-1]
    assert 'data-state="done"' in final[ui.ui.stats] and "× " not in final[ui.ui.stats]
    assert "speed-up vs AR" in final[ui.ui.stats] and "—" not in final[ui.ui.stats]
    assert len(groups(final[ui.ui.output_ar] if ui.ui.output_ar in final else
                      [u for u in updates if ui.ui.output_ar in u][-1][ui.ui.output_ar])) == ar.passes


def test_struck_drafts_show_no_special_tokens(ui, lm):
    # the tiny model answers "the" with "the", so the n-gram lookup copies what followed "the" in the prompt:
    # the chat template's "<|im_end|>", which the model rejects (issue 55, item 6b)
    session = Session()
    updates = list(run(ui, session, prompt="the", max_new=10, mode="Verified (lossless)"))
    specials = set(lm.tokenizer.all_special_ids)
    assert any(specials & set(r.rejected_token_ids) for r in session.mars.steps)  # the case is met
    html = [u for u in updates if ui.ui.output in u][-1][ui.ui.output]
    assert "&lt;|im_" not in html and "<|im_" not in html and '<s class="mars-rejected"' in html
    assert "<|im_" not in "".join(t for r in session.mars.steps for t in r.rejected_texts)
    page = Path(updates[-1][ui.ui.download_html]["value"]).read_text()
    assert "&lt;|im_end|&gt;" not in page.split("<p><b>Generation</b></p>")[1]  # nor in the downloaded page's


def test_verified_mode_is_ar_token_for_token_and_shows_rejected_drafts(ui, lm):
    session = Session()
    updates = list(run(ui, session, tau=0.0, max_new=40, compare=True, mode="Verified (lossless)"))
    ver, ar = session.mars, session.ar
    assert ver.config.mode == "verified" and ar.config.mode == "ar"
    assert ver.token_ids == ar.token_ids == greedy(lm, PROMPT, "ar").token_ids  # lossless: exactly AR greedy
    assert ver.passes <= ar.passes
    assert sum(r.drafts_sent for r in ver.steps) > 0 and any(r.rejected_token_ids for r in ver.steps)
    final = updates[-1]
    html = [u for u in updates if ui.ui.output in u][-1][ui.ui.output]
    struck = html.count('<s class="mars-rejected"')
    assert struck == sum(1 for r in ver.steps if "".join(r.rejected_texts))  # a draft of special tokens alone: none
    # what copying gives: the struck drafts are not in it (an EOS alone in its pass shows the end mark ∎)
    assert text_of(html).replace("∎", "") == ar.text == ver.text
    assert 'data-state="done"' in final[ui.ui.stats] and "Verified MARS:" in final[ui.ui.stats]
    page = Path(final[ui.ui.download_html]["value"]).read_text()
    assert page.count('class="mars-rejected"') >= struck
    trace = json.loads(Path(final[ui.ui.download_json]["value"]).read_text())
    assert trace["mars"]["text"] == ar.text and "rejected_texts" in trace["mars"]["steps"][0]
    i = next(i for i, r in enumerate(ver.steps) if r.rejected_token_ids)
    inspector = ui.inspect(i, session)
    assert "checked against the model" in inspector and "rejected: not the model&#x27;s choice" in inspector
    assert "differs from the model" in inspector
    one = next(i for i, r in enumerate(ver.steps) if len(r.token_ids) == 1)  # e.g. the first pass: no drafts yet
    assert "1 token accepted" in ui.inspect(one, session) and "1 tokens" not in ui.inspect(one, session)


def test_inspector_explains_each_pass(ui):
    session = Session()
    list(run(ui, session, tau=0.05, block=4))
    rec = session.mars.steps[0]
    html = ui.inspect(0, session)
    assert html.count("<tr>") == 1 + 4  # header + the B proposals
    assert "AR token (0)" in html and "mask +3" in html and "chain stopped" in html
    last = ui.inspect(10_000, session)  # clamped to the last pass
    assert f"Pass {session.mars.passes - 1}:" in last
    assert len(rec.candidates) == 4 and len(rec.candidates[0]) == 5


def test_downloads_are_standalone_and_escaped(ui):
    session = Session()
    prompt = 'the <script>alert(1)</script> <img src=x onerror="alert(2)"> ?'
    final = list(run(ui, session, prompt=prompt, max_new=8))[-1]
    page = Path(final[ui.ui.download_html]["value"]).read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script>alert" not in page and "<img" not in page
    trace = json.loads(Path(final[ui.ui.download_json]["value"]).read_text())
    assert trace["mars"]["prompt"] == prompt and trace["mars"]["steps"][0]["token_ids"]


def test_clear_resets_outputs_and_stops(ui):
    session = Session()
    stream = run(ui, session)
    next(stream), next(stream)
    control = session.control
    cleared = ui.clear(session)
    assert control.cancelled and session.control is None and session.mars is None
    assert groups(cleared[ui.ui.output]) == [] and 'data-state="idle"' in cleared[ui.ui.stats]
    assert cleared[ui.ui.download_json]["interactive"] is False  # the cleared run's files are no longer offered
    assert ui.ui.prompt not in cleared  # the prompt stays for the next run
    stream.close()


@pytest.mark.parametrize("text_every_s", [0.0, 10.0])  # every pass sent; passes held back, as the page's 0.1 s
def test_clear_during_a_race_ends_it_quietly_and_keeps_the_page_clear(ui, monkeypatch, text_every_s):
    """Clear pressed while a run and its AR race stream (the browser review: an "Error" on the stats and "The run
    failed: AttributeError ..." once the stream read back a run Clear had just forgotten, and otherwise the
    stopped run painted back over the cleared page). Clear comes between two passes, as a click does (it runs
    outside the queue, on another thread): here from inside the MARS run's stream, after an AR pass. The
    cleared run ends without an error, its last update the cleared page: the outputs Clear emptied stay empty."""
    monkeypatch.setattr(ui, "text_every_s", text_every_s)
    session = Session()
    real = app_module.run_stream

    def clicked_mid_run(holder, lm, prompt, ids, cfg, control):
        for i, rec in enumerate(real(holder, lm, prompt, ids, cfg, control)):
            yield rec
            if cfg.mode != "ar" and i == 2:  # the click, before this run's next pass
                ui.clear(session)

    monkeypatch.setattr(app_module, "run_stream", clicked_mid_run)
    before, after = [], []
    for u in run(ui, session, compare=True, max_new=40):  # no gr.Error
        (before if session.control is not None else after).append(u)
    assert any(ui.ui.output in u for u in before)  # it did stream before the click
    # after it, one last update: the cleared page again (Gradio sends an event's last update again at its end)
    assert len(after) == 1 and groups(after[0][ui.ui.output]) == groups(after[0][ui.ui.output_ar]) == []
    assert 'data-state="idle"' in after[0][ui.ui.stats] and after[0][ui.ui.download_html]["interactive"] is False
    assert session.mars is None and session.ar is None


def test_sweep_compares_each_tau_with_ar(ui):
    session = Session()
    updates = list(ui.run_sweep(PROMPT, "1.0, 0.05", 4, 24, "prob", session))
    table = updates[-1][ui.ui.sweep_table]
    fig = updates[-1][ui.ui.chart_sweep]
    assert table.count("<tr>") == 3
    assert list(fig.data[0].y)[0] == 1.0  # tau = 1 reproduces the AR output exactly
    # the B it ran at (the Generate tab's slider: the Sweep tab has none of its own) is named
    assert "B = 4" in fig.layout.title.text and "at B = 4" in updates[0][ui.ui.sweep_table]
    at_3 = list(ui.run_sweep(PROMPT, "1.0", 3, 8, "prob", session))[-1][ui.ui.chart_sweep]
    assert "B = 3" in at_3.layout.title.text
    with pytest.raises(gr.Error):
        list(ui.run_sweep(PROMPT, "1.0, banana", 4, 24, "prob", session))


def test_api_returns_text_and_trace(ui, lm):
    text, trace = call_api(ui, PROMPT, 0.5, 4, 30)
    assert text == greedy(lm, PROMPT, "mars", tau=0.5, max_new=30).text == trace["text"]
    assert trace["passes"] == len(trace["steps"]) > 0
    first = trace["steps"][0]
    keys = {"pass_index", "token_ids", "token_texts", "confidences", "rejected_confidences", "tau", "seconds"}
    assert keys <= set(first)
    json.dumps(trace)  # plain JSON all the way down


@pytest.mark.parametrize(
    "args",
    [("", 0.9, 4, 30), ("   ", 0.9, 4, 30), (3, 0.9, 4, 30), (PROMPT, 1.5, 4, 30), (PROMPT, -0.1, 4, 30),
     (PROMPT, "abc", 4, 30), (PROMPT, None, 4, 30), (PROMPT, float("nan"), 4, 30), (PROMPT, 0.9, 0, 30),
     (PROMPT, 0.9, 17, 30), (PROMPT, 0.9, 2.5, 30), (PROMPT, 0.9, "4", 30), (PROMPT, 0.9, 4, 0),
     (PROMPT, 0.9, 4, 10**7), (PROMPT, 0.9, 4, True), ("x " * 3000, 0.9, 4, 30)],
)
def test_api_bad_input_is_a_clear_error(ui, args):
    with pytest.raises(gr.Error):
        call_api(ui, *args)


def test_ui_bad_input_is_a_clear_error(ui):
    with pytest.raises(gr.Error, match="empty"):
        list(run(ui, Session(), prompt=" "))
    with pytest.raises(gr.Error):
        ui.set_tau(2.0, Session())


def test_concurrent_visitors_get_their_own_greedy_result(ui, lm):
    prompts = [PROMPT, "tell me about the water", "what is a good day", "the old man and the house"]
    expected = {p: greedy(lm, p, "mars", tau=0.3, max_new=30).text for p in prompts}
    got = {}

    def visit(p):
        got[p] = call_api(ui, p, 0.3, 4, 30)[0]

    threads = [threading.Thread(target=visit, args=(p,)) for p in prompts]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert got == expected


def test_model_panel_says_when_no_adapter_is_loaded(ui):
    banner, table, *_ = ui.model_info()
    assert "No MARS adapter" in banner and "tiny-llama" in table


def test_loading_another_model_offline_keeps_the_current_one(ui, lm, tmp_path):
    from mars.app.policy import Policy

    lm_new, message = load_other("someone/some-model", None, Policy(allowed_models=("*",)), reachable=lambda: False)
    assert lm_new is None and "no network access" in message and "keeps serving" in message
    message, _, table, _ = ui.load_model(str(tmp_path / "missing"), "")
    assert "keeps serving" in message and ui.holder.loaded is lm
    message, *_ = ui.load_model('<img src=x onerror="alert(1)">', "")
    assert "<img" not in message
    folder = save_tiny(tmp_path / "tiny2", seed=1)
    lm2, message = load_other(str(folder), "", Policy(models_dir=tmp_path))
    assert lm2 is not None and message.startswith("Loaded")


def test_default_provider_reads_the_environment(tmp_path, env):
    from mars.app.serving import default_provider

    folder = save_tiny(tmp_path / "tiny")
    env.set("MARS_MODEL", str(folder))
    env.set("MARS_ADAPTER", "none")
    loaded = default_provider()()
    assert loaded.name == str(folder) and loaded.mask_token == "<|mask|>"


def test_public_api_over_http_and_bad_input_keeps_serving(lm):
    from gradio_client import Client

    demo = app_module.create_demo(lambda: lm)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
        assert list(api) == ["/generate", "/generate_verified"]  # the UI's own events stay private
        names = [p["parameter_name"] for p in api["/generate_verified"]["parameters"]]
        assert names == ["prompt", "block_size", "max_new_tokens", "tau", "tree_nodes"]
        assert api["/generate_verified"]["parameters"][3]["parameter_default"] == 0.0  # lossless at its fastest
        names = [p["parameter_name"] for p in api["/generate"]["parameters"]]
        assert names == ["prompt", "tau", "block_size", "max_new_tokens"]
        returns = [r["python_type"]["type"] for r in api["/generate"]["returns"]]
        assert returns[0] == "str" and returns[1].startswith("dict") and len(returns) == 2
        with pytest.raises(Exception, match="empty"):
            client.predict("", 0.9, 4, 20, api_name="/generate")
        with pytest.raises(Exception, match="tau"):
            client.predict(PROMPT, "high", 4, 20, api_name="/generate")
        text, trace = client.predict(PROMPT, 0.5, 4, 20, api_name="/generate")  # still serving
        assert text == greedy(lm, PROMPT, "mars", tau=0.5, max_new=20).text and trace["steps"]
        text, trace = client.predict(PROMPT, 4, 20, api_name="/generate_verified")  # verified: exactly AR's text
        assert text == greedy(lm, PROMPT, "ar", tau=1.0, max_new=20).text
        assert trace["mode"] == "verified" and trace["settings"]["tau"] == 0.0
        assert trace["settings"]["tree_nodes"] == app_tree_nodes()  # the page's tree unless told otherwise
        # by default the API drafts as the page does: its block size and tree on this device (issue 53, item 8)
        text, trace = client.predict(PROMPT, None, 20, api_name="/generate_verified")
        assert text == greedy(lm, PROMPT, "ar", tau=1.0, max_new=20).text
        assert trace["settings"]["block_size"] == mode_block("verified", lm)
        assert trace["settings"]["tree_nodes"] == app_tree_nodes() > 0
        _, trace = client.predict(PROMPT, 3, 20, 0.0, 0, api_name="/generate_verified")  # parameters override it
        assert trace["settings"]["block_size"] == 3 and trace["settings"]["tree_nodes"] == 0
    finally:
        demo.close()


def test_python_app_py_honours_server_name_and_port(tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), MARS_MODEL=str(folder),
               GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    assert r.status == 200 and b"MARS Playground" in r.read()
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.5)
        else:
            pytest.fail("python app.py did not serve on GRADIO_SERVER_PORT")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_verified_mode_drafts_from_two_sources_and_the_inspector_says_which(ui, lm):
    """The app's lossless mode takes each pass's drafts from the masks or from n-gram lookup in the text,
    stays exactly AR's text, and the pass inspector names the source of a pass's drafts."""
    session = Session()
    prompt = "repeat after me: red green blue red green blue red green blue red green blue"
    for _ in ui.generate(prompt, 0.0, 4, 40, "prob", False, "Verified (lossless)", session):
        pass
    run = session.mars
    assert run.config.mode == "verified" and run.config.drafts == "both"
    ids = encode_prompt(lm.tokenizer, prompt)
    ar = generate_ids(lm, [ids], DecodeConfig(mode="ar", max_new_tokens=40, backend=app_backend()))[0]
    assert run.token_ids == ar.token_ids
    sources = {s.draft_source for s in run.steps}
    assert "lookup" in sources  # the tiny model repeats itself: copies fire
    i = next(k for k, s in enumerate(run.steps) if s.draft_source == "lookup")
    assert "copied from the text" in ui.inspect(i, session)


def test_the_docker_image_build_step_runs_here():
    """The Dockerfile's build-time step (GGUF conversion and adapter check) runs as written: an import path it
    names that the package no longer has would fail the image build, which no test here can run."""
    import re

    step = re.search(r'^RUN python -c "(.+)"$', (ROOT / "Dockerfile").read_text(), re.M)
    assert step, "the Dockerfile's build-time model step is missing"
    out = subprocess.run([sys.executable, "-c", step.group(1)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "model ready: smollm2 True" in out.stdout


def test_the_tree_slider_starts_at_the_cpu_tree_on_a_cpu_and_at_the_chain_elsewhere(monkeypatch, env):
    """Verified mode's fastest setting measured on two CPU cores is a 4-node tree with one mask group
    (docs/tree.md); a GPU keeps the chain until trees are measured there."""
    import mars.models.device as device
    from mars.app.inputs import app_tree_nodes
    from mars.decoding.tree import DEFAULT_TREE_NODES

    env.set("MARS_DEVICE", "cpu")
    assert app_tree_nodes() == DEFAULT_TREE_NODES["cpu"] == 4
    assert app_module.create_demo(lambda: None).mars_app.ui.tree_nodes.value == 4  # the page's slider
    monkeypatch.setattr(device, "env_device", lambda: "cuda")
    assert app_tree_nodes() == 0
    monkeypatch.setattr(device, "env_device", lambda: (_ for _ in ()).throw(device.DeviceError("no GPU")))
    assert app_tree_nodes() == 0  # MARS_DEVICE=cuda without a GPU: the model load's message, not the page's crash
