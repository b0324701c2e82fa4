"""The app under hostile or unlucky conditions (issue 6): odd prompts, odd parameters, odd models, many
visitors, visitors who leave, failed loads, and memory over many runs.

Handlers are called directly where that suffices; the HTTP tests serve the app on 127.0.0.1 and call it with
gradio_client (the public API) or, for the UI's private streaming event, with the browser's own queue protocol.
"""

from __future__ import annotations

import gc
import json
import math
import threading
import time
import urllib.request
from pathlib import Path

import gradio as gr
import httpx
import pytest

import app as app_module
from mars import settings
from mars.decoding.scheduler import Scheduler
from conftest import serve
from mars.app import serving
from mars.app.serving import default_provider
from mars.app.session import Session
from mars.app.inputs import VERIFIED_CPU_BLOCK, app_backend, app_tree_nodes, check_prompt, make_config, mode_block, sanitize_text
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.models.loading import LoadError
from tiny import make_loaded, save_tiny

PROMPT = "what is the capital of france ?"
MARS, VERIFIED = "MARS (tau rule)", "Verified (lossless)"



def call_api(ui, *args):
    """What an API client gets: the endpoint is a generator (one yield per pass), the client the last yield."""
    *_, last = ui.api_generate(*args)
    return last


@pytest.fixture(scope="module")
def server(lm):
    demo, url = serve(lambda: lm)
    yield url
    demo.close()


def client_for(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def run(ui, session, prompt=PROMPT, tau=0.9, block=4, max_new=30, compare=False, mode=MARS):
    return ui.generate(prompt, tau, block, max_new, "prob", compare, mode, session)


def alone(lm, prompt, mode="mars", tau=0.9, max_new=30, block=4):
    ids = encode_prompt(lm.tokenizer, sanitize_text(prompt))
    cfg = DecodeConfig(mode=mode, tau=tau, max_new_tokens=max_new, block_size=block, backend=app_backend())
    return generate_ids(lm, [ids], cfg)[0]


def endless(lm):
    """The same model, never ending on EOS: a run that lasts until max new tokens, or until it is stopped."""
    lm.model.generation_config.eos_token_id = []
    return lm


def counting(monkeypatch, delay: float = 0.0) -> list[int]:
    """Count the rows' passes the app's runs compute (one per record), ~`delay` s each pass.

    Wraps the scheduler's step (mars.decoding.scheduler), which every path runs through: the shared passes of
    continuous batching and a run of its own (MARS_BATCHING=0), whatever backend runs the model.
    """
    calls, real = [0], Scheduler.step

    def counted(self, *args, **kwargs):
        records = real(self, *args, **kwargs)
        calls[0] += len(records)
        if records:
            time.sleep(delay)
        return records

    monkeypatch.setattr(Scheduler, "step", counted)
    return calls


def rss_mb(pid: str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


# ------------------------------------------------------------------------------------------------ prompts

ODD_PROMPTS = {
    "nul inside": "the\x00 capital\x00",
    "lone surrogate": "the \ud800 capital",
    "surrogate pair as two code points": "the \ud83d\ude00 capital",
    "right-to-left marks": "\u202ethe capital\u202c \u200f?",
    "combining characters": "the e\u0301\u0301\u0301\u0301 capital",
    "emoji": "😀🎭 the capital 👩‍👩‍👧",
    "control characters": "the\x07\x1b[31m capital\r\n\t\x7f",
    "markup": '<script>alert(1)</script><img src=x onerror="alert(2)">',
}


def test_sanitize_keeps_text_but_makes_it_valid():
    assert sanitize_text("a\x00b") == "ab"
    assert sanitize_text("a\ud800b") == "a\ufffdb"  # a lone surrogate is not valid UTF-8
    assert sanitize_text("\ud83d\ude00") == "😀"  # a pair that arrived as halves is joined
    kept = "\u202eabc\u202c e\u0301 😀 \x07\t\n"
    assert sanitize_text(kept) == kept
    for text in ODD_PROMPTS.values():
        sanitize_text(text).encode("utf-8")  # strict: no surrogates left


@pytest.mark.parametrize("prompt", [None, "", "   ", "\n\t \r", "\x00\x00", " \x00 "])
def test_empty_prompts_have_one_message(ui, prompt):
    with pytest.raises(gr.Error, match="the prompt is empty"):
        call_api(ui, prompt, 0.9, 4, 10)
    with pytest.raises(gr.Error, match="the prompt is empty"):
        list(run(ui, Session(), prompt=prompt))


def test_non_text_prompt(ui):
    for prompt in (3, ["a"], {"a": 1}, b"bytes"):
        with pytest.raises(gr.Error, match="the prompt must be text"):
            call_api(ui, prompt, 0.9, 4, 10)


@pytest.mark.parametrize("name", list(ODD_PROMPTS))
def test_odd_prompts_are_answered(ui, lm, name):
    prompt = ODD_PROMPTS[name]
    text, trace = call_api(ui, prompt, 0.5, 4, 12)
    assert text == alone(lm, prompt, tau=0.5, max_new=12).text
    json.dumps(trace, ensure_ascii=False).encode("utf-8")  # what Gradio's JSON encoder needs
    assert trace["prompt"] == sanitize_text(prompt)
    updates = list(run(ui, Session(), prompt=prompt, max_new=12))
    assert 'data-state="done"' in updates[-1][ui.ui.stats]


def test_prompt_token_cap_is_server_side_and_named(ui, env):
    env.set("MARS_MAX_PROMPT_TOKENS", "20")
    with pytest.raises(gr.Error, match="too long: 35 tokens with the chat template, at most 20"):
        call_api(ui, "the " * 30, 0.9, 4, 10)
    with pytest.raises(gr.Error, match="at most 20"):
        list(run(ui, Session(), prompt="the " * 30))
    with pytest.raises(ValueError, match="limited to 20 tokens"):  # checked before tokenizing: cheap
        check_prompt("x" * 400)
    env.unset("MARS_MAX_PROMPT_TOKENS")
    # within the cap but not within the tiny model's context of 512 positions
    with pytest.raises(gr.Error, match="context of 512 tokens"):
        call_api(ui, "the " * 400, 0.9, 4, 128)


# --------------------------------------------------------------------------------------------- parameters

BAD = [
    ("tau", [0.5]), ("tau", {"a": 1}), ("tau", math.inf), ("tau", "0.5"), ("tau", True),
    ("block_size", None), ("block_size", [4]), ("block_size", math.nan), ("block_size", 1e300), ("block_size", -4),
    ("max_new_tokens", None), ("max_new_tokens", "12"), ("max_new_tokens", [12]), ("max_new_tokens", -1),
    ("max_new_tokens", 2.5), ("max_new_tokens", 513),
    ("mode", "fast"), ("mode", None), ("mode", 3), ("mode", ["mars"]),
]


@pytest.mark.parametrize("name,value", BAD)
def test_bad_parameters_have_clear_messages(ui, name, value):
    args = {"prompt": PROMPT, "tau": 0.9, "block_size": 4, "max_new_tokens": 10, "mode": MARS} | {name: value}
    label = {"block_size": "block size", "max_new_tokens": "max new tokens"}.get(name, name)
    session = Session()
    with pytest.raises(gr.Error, match=label) as err:
        list(ui.generate(args["prompt"], args["tau"], args["block_size"], args["max_new_tokens"], "prob", False,
                         args["mode"], session))
    assert len(str(err.value)) < 200  # a client's huge value is not echoed back whole
    if name != "mode":
        with pytest.raises(gr.Error, match=label):
            call_api(ui, args["prompt"], args["tau"], args["block_size"], args["max_new_tokens"])


def test_cache_block_and_confidence_are_checked():
    for value in (0, "32", None, [32], 1e9):
        with pytest.raises(ValueError, match="cache block"):
            make_config("mars", 0.9, 4, 10, cache_block=value)
    with pytest.raises(ValueError, match="confidence"):
        make_config("mars", 0.9, 4, 10, confidence=["prob"])
    assert make_config("mars", 0.9, 4.0, 10.0, cache_block=16.0).cache_block == 16


def test_block_size_beyond_the_trained_one_runs_but_is_flagged(ui, lm):
    lm.trained_block_size = 2
    try:
        updates = list(run(ui, Session(), block=4))
        assert "larger than the 2 this model was trained with" in updates[-1][ui.ui.stats]
        text, trace = call_api(ui, PROMPT, 0.9, 4, 10)
        assert text == alone(lm, PROMPT, max_new=10).text and "larger than the 2" in trace["warnings"][0]
        assert call_api(ui, PROMPT, 0.9, 2, 10)[1]["warnings"] == []
    finally:
        lm.trained_block_size = None


def test_bad_values_over_http_get_messages_and_the_server_keeps_serving(server, lm):
    client = client_for(server)
    for args, match in [((PROMPT, None, 4, 10), "tau"), ((PROMPT, [0.5], 4, 10), "tau"),
                        ((PROMPT, 0.9, "4", 10), "block size"), ((PROMPT, 0.9, 4, 10**9), "max new tokens"),
                        (("", 0.9, 4, 10), "empty"), (("the " * 2000, 0.9, 4, 10), "at most 1024")]:
        with pytest.raises(Exception, match=match):
            client.predict(*args, api_name="/generate")
    # NaN (not JSON) and lone surrogates (not UTF-8): gradio_client will not send them, a raw client can
    event, error = raw_call(server, [PROMPT, math.nan, 4, 10])
    assert event == "error" and "tau must be a number between 0 and 1, got nan" in error["error"]
    for prompt in ODD_PROMPTS.values():  # every odd prompt comes back answered, as valid JSON
        if any("\ud800" <= ch <= "\udfff" for ch in prompt):
            event, (text, trace) = raw_call(server, [prompt, 0.5, 4, 8])
        else:
            text, trace = client.predict(prompt, 0.5, 4, 8, api_name="/generate")
        assert text == alone(lm, prompt, tau=0.5, max_new=8).text and trace["prompt"] == sanitize_text(prompt)


def test_visitor_input_errors_leave_no_traceback_in_the_log(server, capfd):
    """Gradio prints a traceback for every gr.Error unless told not to: ~37 lines of log per typo. A refused
    input prints nothing; the server still answers it with its message."""
    client = client_for(server)
    capfd.readouterr()
    for args, match in [(("", 0.9, 4, 10), "empty"), ((PROMPT, 2.0, 4, 10), "tau"),
                        ((PROMPT, 0.9, 4, 10**9), "max new tokens"), (("the " * 2000, 0.9, 4, 10), "at most 1024")]:
        with pytest.raises(Exception, match=match):
            client.predict(*args, api_name="/generate")
    err = capfd.readouterr().err
    assert "Traceback" not in err and "gradio.exceptions.Error" not in err, err[-2000:]


def test_every_refused_input_is_quiet_and_a_failure_logs_where_it_failed(ui, monkeypatch, caplog):
    for args in [("", 0.9, 4, 10, "prob", False, MARS), (PROMPT, 0.9, 4, -1, "prob", False, MARS),
                 (PROMPT, 0.9, 4, 10, "prob", False, "fast")]:
        with pytest.raises(gr.Error) as err:
            list(ui.generate(*args, Session()))
        assert err.value.print_exception is False, err.value
    with pytest.raises(gr.Error) as err:
        ui.set_tau(7, Session())
    assert err.value.print_exception is False
    with pytest.raises(gr.Error) as err:
        list(ui.run_sweep(PROMPT, "1.0, nope", 4, 10, "prob", Session()))
    assert err.value.print_exception is False

    def broken_stream(*a, **k):  # a bug deep in a run: not the visitor's doing
        raise RuntimeError("kaput")
        yield

    monkeypatch.setattr(app_module, "run_stream", broken_stream)
    for call in (lambda: list(run(ui, Session())), lambda: call_api(ui, PROMPT, 0.9, 4, 10)):
        caplog.clear()
        with pytest.raises(gr.Error, match="The run failed: RuntimeError: kaput") as err:
            call()
        # its traceback, down to the frame that failed, is logged once; Gradio does not print a second one
        # that would show only the `raise gr.Error(...) from None` line
        logged = [r for r in caplog.records if r.exc_info]
        assert len(logged) == 1 and logged[0].exc_info[1].args == ("kaput",)
        assert "broken_stream" in caplog.text and err.value.print_exception is False


def test_the_pass_inspectors_slider_takes_a_number_beyond_the_run_as_its_last_pass():
    """Gradio's own Slider refuses an out-of-range value ("Value 9999 is greater than maximum value 66.", a
    traceback in the log): the pass box is the one whose visitors type numbers beyond it."""
    from mars.app.components import ClampedSlider

    with pytest.raises(gr.Error, match="greater than maximum"):
        gr.Slider(0, 66, value=0, step=1).preprocess(9999)
    passes = ClampedSlider(0, 66, value=0, step=1, label="pass")
    assert [passes.preprocess(v) for v in (9999, -5, 3, 66, math.nan)] == [66, 0, 3, 66, 0]
    assert passes.get_block_name() == "slider"  # the page draws Gradio's own slider


def raw_call(server, data) -> tuple[str, object]:
    """The public endpoint over plain HTTP, JSON written by hand: (last event name, its data)."""
    call = f"{server}gradio_api/call/generate"
    body = json.dumps({"data": data})  # ensure_ascii: a lone surrogate travels as the escape \\ud800
    event_id = httpx.post(call, content=body, headers={"content-type": "application/json"}, timeout=10).json()
    lines = httpx.get(f"{call}/{event_id['event_id']}", timeout=60).text.strip().splitlines()
    events = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    return events[-1], payloads[-1]


# ------------------------------------------------------------------------------------------------- models


def test_a_model_without_mask_token_runs_ar_and_says_so():
    lm = make_loaded(mask=False)
    ui = app_module.create_demo(lambda: lm).mars_app
    expected = alone(lm, PROMPT, "ar", max_new=20)
    for mode in (MARS, VERIFIED):
        session = Session()
        updates = list(run(ui, session, max_new=20, compare=True, mode=mode))
        assert session.mars.config.mode == "ar" and session.ar is None  # nothing to compare with itself
        assert session.mars.token_ids == expected.token_ids
        assert "no mask token" in updates[-1][ui.ui.stats] and "plain AR" in updates[-1][ui.ui.stats]
    text, trace = call_api(ui, PROMPT, 0.9, 4, 20)
    assert text == expected.text and "no mask token" in trace["warnings"][0]
    assert "AR only" in ui.model_info()[0]
    with pytest.raises(gr.Error, match="no mask token"):
        list(ui.run_sweep(PROMPT, "1.0, 0.5", 4, 10, "prob", Session()))


def test_a_failed_load_leaves_the_app_up_with_one_clear_message():
    calls = []

    def provider():
        calls.append(1)
        raise LoadError("could not load model '<b>nope</b>'")

    ui = app_module.create_demo(provider).mars_app
    banner, table, *_ = ui.model_info()
    assert "The model could not be loaded" in banner and "&lt;b&gt;nope" in banner and "<b>nope" not in banner
    assert "keeps running" in banner
    for _ in range(2):
        with pytest.raises(gr.Error, match="could not be loaded"):
            list(run(ui, Session()))
        with pytest.raises(gr.Error, match="could not be loaded"):
            call_api(ui, PROMPT)
    assert len(calls) == 1  # remembered: visitors do not each wait for a doomed load
    ui.holder.replace(make_loaded())  # what the Model tab's Load does
    assert call_api(ui, PROMPT, 0.9, 4, 5)[0]

    def broken():
        raise RuntimeError("out of memory")

    ui = app_module.create_demo(broken).mars_app
    assert "RuntimeError: out of memory" in ui.model_info()[0]


def test_a_failed_load_over_http():
    demo, url = serve(lambda: (_ for _ in ()).throw(LoadError("model folder '/x' does not exist")), load_first=False)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
        client = client_for(url)
        for _ in range(2):
            with pytest.raises(Exception, match="could not be loaded: model folder '/x' does not exist"):
                client.predict(PROMPT, 0.9, 4, 10, api_name="/generate")
    finally:
        demo.close()


def test_missing_adapter_falls_back_to_the_bare_model_with_a_visible_warning(tmp_path, env):
    folder = save_tiny(tmp_path / "tiny")
    env.set("MARS_MODEL", str(folder))
    env.set("MARS_ADAPTER", str(tmp_path / "nowhere"))
    lm = default_provider()()
    assert lm.adapter is None and "MARS_ADAPTER" in lm.warnings[0] and "bare model" in lm.warnings[0]
    ui = app_module.create_demo(lambda: lm).mars_app
    banner = ui.model_info()[0]
    assert "MARS_ADAPTER" in banner and "does not exist" in banner
    env.set("MARS_MODEL", str(tmp_path / "no-model"))  # the model itself missing: no fallback
    with pytest.raises(LoadError, match="does not exist"):
        default_provider()()


def test_hub_offline_is_honoured_without_a_network_call(monkeypatch):
    from mars.app.policy import Policy
    from mars.app.serving import hub_reachable, load_other

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False
    lm, message = load_other("someone/some-model", None, Policy(allowed_models=("*",)))
    assert lm is None and "no network access" in message


def test_no_remote_code_by_default():
    import inspect

    from mars.models.loading import load

    assert inspect.signature(load).parameters["trust_remote_code"].default is False


# -------------------------------------------------------------------------------------------- concurrency


def test_six_visitors_at_once_each_get_their_own_greedy_output(server, lm):
    visitors = [(f"{w} is the capital of france ?", tau) for w, tau in
                zip(["what", "where", "how", "why", "which", "who"], [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])]
    got, errors = {}, []

    def visit(prompt, tau):
        try:
            client = client_for(server)
            got[prompt] = [client.predict(prompt, tau, 4, 24, api_name="/generate")[0] for _ in range(2)]
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=visit, args=v) for v in visitors]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert not errors
    for prompt, tau in visitors:
        assert got[prompt] == [alone(lm, prompt, tau=tau, max_new=24).text] * 2


def test_one_visitors_tau_never_reaches_another_run(ui, lm):
    taus = [0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
    sessions = [Session() for _ in taus]
    steered = sessions[0]
    errors = []

    def visit(session, tau):
        try:
            stream = run(ui, session, tau=tau, max_new=30)
            for k, _ in enumerate(stream):
                if session is steered and k == 3:
                    ui.set_tau(0.05, session)  # what the slider does, mid-run, while the others run
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=visit, args=(s, t)) for s, t in zip(sessions, taus)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert not errors
    assert 0.05 in {r.tau for r in steered.mars.steps}
    for session, tau in list(zip(sessions, taus))[1:]:
        assert {r.tau for r in session.mars.steps} == {tau}
        assert session.mars.token_ids == alone(lm, PROMPT, tau=tau, max_new=30).token_ids


# ------------------------------------------------------------------------------------------ stop and leave


def test_closing_the_stream_stops_the_decoder_and_the_next_run_is_clean(monkeypatch):
    lm = endless(make_loaded())
    calls = counting(monkeypatch)
    ui = app_module.create_demo(lambda: lm).mars_app
    session = Session()
    stream = run(ui, session, max_new=400)
    for _ in range(6):
        next(stream)
    at = calls[0]
    assert at >= 5
    stream.close()  # what Gradio does to the generator when the visitor's connection goes
    assert session.control.cancelled
    time.sleep(0.2)
    time.sleep(0.2)
    settled = calls[0]
    assert settled - at <= 2  # the pass in flight, and one the server may run ahead of its reader (batching.LOOKAHEAD)
    time.sleep(0.3)
    assert calls[0] == settled  # and then not one more
    session2 = Session()
    list(run(ui, session2, max_new=20))
    assert session2.mars.token_ids == alone(lm, PROMPT, max_new=20).token_ids


def join_and_leave(demo, url, api_name: str, data: list, calls: list) -> int:
    """The browser's own protocol for one event: join the queue, read the stream until 8 passes have run,
    hang up (as closing the tab, or a client going away, does). Returns the passes run by then."""
    dep = next(d for d in demo.config["dependencies"] if d.get("api_name") == api_name)
    session = f"leaver-{api_name}"
    body = {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None,
            "trigger_id": dep["targets"][0][0] if dep.get("targets") and api_name.startswith("ui_") else None}
    assert httpx.post(f"{url}gradio_api/queue/join", json=body, timeout=10).status_code == 200
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}, timeout=30) as resp:
        for line in resp.iter_lines():
            if '"process_generating"' in line and calls[0] >= 8:
                break  # leaving the block closes the connection
    return calls[0]


def test_a_visitor_who_leaves_mid_run_frees_the_model_within_a_pass(monkeypatch):
    """The browser's own protocol: join the queue for the UI's Generate event, read a few passes, hang up."""
    lm = endless(make_loaded())
    calls = counting(monkeypatch, delay=0.05)
    demo, url = serve(lambda: lm)
    try:
        at = join_and_leave(demo, url, "ui_generate", [PROMPT, 0.9, 4, 400, "prob", False, MARS, None], calls)
        assert at >= 8
        time.sleep(1.5)  # 30 passes' worth at 50 ms a pass
        assert calls[0] - at <= 2  # the pass in flight, and one the server may run ahead (batching.LOOKAHEAD)
        text, _ = client_for(url).predict(PROMPT, 0.9, 4, 10, api_name="/generate")  # next run starts cleanly
        assert calls[0] - at > 1 and text
    finally:
        demo.close()


def test_an_api_caller_who_leaves_frees_the_model_within_a_pass(monkeypatch):
    """A plain /generate call over Gradio's protocol, hung up mid-run: its run stops within one pass, and the
    next caller's run starts at once (Gradio cannot cancel a plain function; the endpoint is a generator)."""
    lm = endless(make_loaded())
    calls = counting(monkeypatch, delay=0.05)
    demo, url = serve(lambda: lm)
    try:
        at = join_and_leave(demo, url, "generate", [PROMPT, 0.9, 4, 400], calls)
        assert 8 <= at < 40  # left mid-run, far from the 400-token cap
        time.sleep(1.5)  # 30 passes' worth at 50 ms a pass
        # the endpoint sends an update at most every MARS_TEXT_EVERY_S (0.1 s: two passes here), and Gradio learns
        # of the hang-up at the next one: the run stops within that, plus the pass in flight
        assert calls[0] - at <= 2 + math.ceil(settings.get().text_every_s / 0.05)  # + batching.LOOKAHEAD
        t0 = time.perf_counter()
        text, trace = client_for(url).predict(PROMPT, 0.9, 4, 10, api_name="/generate")
        assert text and trace["passes"] >= 1 and calls[0] - at > 1
        assert time.perf_counter() - t0 < 10  # a slot was free: no waiting behind the abandoned run
    finally:
        demo.close()


def test_passes_run_on_the_holders_thread_count_in_any_worker_thread(monkeypatch):
    """OpenMP's thread count is per thread: a worker that ran torch before set_num_threads keeps its old
    count, so the holder sets it in the thread that runs each pass."""
    import torch
    from concurrent.futures import ThreadPoolExecutor

    seen, real = [], Scheduler.step

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "step", spy)  # every pass, shared or not
    before = torch.get_num_threads()
    lm = make_loaded()
    holder = serving.ModelHolder(lambda: lm, threads=2)
    pool = ThreadPoolExecutor(1)
    try:
        torch.set_num_threads(1)
        assert pool.submit(lambda: (torch.ones(64, 64) @ torch.ones(64, 64), torch.get_num_threads())[1]).result() == 1
        torch.set_num_threads(2)
        # the worker kept 1 thread: the runtime behaviour that made the app's passes single-threaded
        assert pool.submit(torch.get_num_threads).result() == 1
        ids = encode_prompt(lm.tokenizer, PROMPT)
        cfg = DecodeConfig(mode="mars", tau=0.5, max_new_tokens=6)
        recs = pool.submit(lambda: list(holder.passes(lm, ids, cfg, serving.DecodeControl()))).result()
        assert recs and seen and set(seen) == {2}
    finally:
        pool.shutdown()
        torch.set_num_threads(before)


def test_pass_threads_default_to_every_core_and_honour_mars_threads(env):
    import os

    env.unset("MARS_THREADS")
    assert serving.pass_threads() == (os.cpu_count() or 1)
    env.set("MARS_THREADS", "3")
    assert serving.pass_threads() == 3
    env.set("MARS_THREADS", "two")
    with pytest.raises(ValueError, match="MARS_THREADS must be a whole number"):
        serving.pass_threads()


def test_the_model_loads_at_start_up_and_generate_waits_for_it():
    """holder.start() loads in the background: the page says so, and a Generate meanwhile waits with a note."""
    lm, gate = make_loaded(), threading.Event()

    def slow():
        gate.wait(10)
        return lm

    ui = app_module.create_demo(slow).mars_app
    ui.holder.start()
    assert ui.holder.state == "loading"
    banner, _, _, timer = ui.model_info()
    assert "Loading" in banner and timer["active"] is True  # the page asks again until the model is ready
    session = Session()
    stream = run(ui, session, max_new=8)
    first = next(stream)
    assert 'data-state="loading"' in first[ui.ui.stats] and "waiting for the model" in first[ui.ui.stats]
    gate.set()
    updates = list(stream)
    assert 'data-state="done"' in updates[-1][ui.ui.stats] and session.mars.tokens
    assert ui.holder.state == "ready"
    banner, _, _, timer = ui.model_info()
    assert "Loading" not in banner and timer["active"] is False


def test_the_server_log_says_once_when_the_app_is_ready_and_how_long_the_start_took(capfd):
    lm = make_loaded()
    ui = app_module.create_demo(lambda: lm).mars_app
    capfd.readouterr()
    ui.holder.start()
    ui.holder._loader.join(60)
    lines = [line for line in capfd.readouterr().err.splitlines() if "MARS Playground" in line]
    assert len(lines) == 1 and lines[0].startswith("MARS Playground is ready: tiny-llama, "), lines
    s = ui.holder.start_up
    assert s["ready_s"] >= s["rehearsal_s"] > 0 and s["before_s"] > 0  # this process started before the test
    assert f"{s['before_s'] + s['ready_s']:.1f} s after the process started" in lines[0]
    for part in ("imports and set-up ", "load ", "warm-up ", "first-run rehearsal "):
        assert part in lines[0], part
    age = serving.process_seconds()
    time.sleep(0.2)
    assert serving.process_seconds() - age == pytest.approx(0.2, abs=0.05)

    def provider():
        raise LoadError("no such model 'nope'")

    ui = app_module.create_demo(provider).mars_app
    ui.holder.start()
    ui.holder._loader.join(60)
    lines = [line for line in capfd.readouterr().err.splitlines() if "MARS Playground" in line]
    s = ui.holder.start_up
    assert lines == [f"MARS Playground: the model could not be loaded (no such model 'nope'), "
                     f"{s['before_s'] + s['ready_s']:.1f} s after the process started; the app serves on, its page "
                     "says so"]


def test_the_page_and_the_trace_name_the_model_never_a_server_path(tmp_path):
    lm = make_loaded()
    folder = tmp_path / "deep" / "mars-adapter"
    lm.adapter, lm.name = str(folder), str(tmp_path / "models" / "tiny-llama")
    lm.warnings = [f"no trained MARS adapter at {folder}: running the bare model"]
    ui = app_module.create_demo(lambda: lm).mars_app
    banner, table, *_ = ui.model_info()
    session = Session()
    updates = list(run(ui, session, max_new=8))
    trace = Path(updates[-1][ui.ui.download_json]["value"]).read_text()
    page = Path(updates[-1][ui.ui.download_html]["value"]).read_text()
    for text in (banner, table, trace, page):
        assert str(tmp_path) not in text
    assert "mars-adapter" in table and "tiny-llama" in table
    assert json.loads(trace)["model"]["adapter"] == "mars-adapter"


def test_mode_block_keeps_the_trained_b_except_verified_on_a_cpu(lm, monkeypatch):
    assert lm.default_block_size > VERIFIED_CPU_BLOCK  # the library default B 4 (the tiny model has no mars.json)
    assert mode_block("verified", lm) == VERIFIED_CPU_BLOCK and mode_block("mars", lm) == lm.default_block_size
    assert mode_block("verified") == VERIFIED_CPU_BLOCK  # no model yet: the page's first value
    monkeypatch.setattr(lm, "trained_block_size", 1)
    assert mode_block("verified", lm) == 1  # never above the trained B
    monkeypatch.setattr(lm, "trained_block_size", 4)

    class OnGpu:  # a model on a GPU: width is ~free there, so verified keeps every trained mask
        device = "cuda:0"

    monkeypatch.setattr(lm, "model", OnGpu())
    assert mode_block("verified", lm) == 4


def test_verified_mode_starts_at_its_fastest_lossless_setting(lm):
    ui = app_module.create_demo(lambda: lm).mars_app
    ui.holder.get()
    tau, block = ui.mode_changed(VERIFIED)
    assert tau["value"] == 0.0 and "verified" in tau["label"]
    assert block["value"] == min(lm.default_block_size, VERIFIED_CPU_BLOCK) == 2  # one mask a pass on a CPU
    tau, block = ui.mode_changed(MARS)
    assert tau["value"] == 0.9 and block["value"] == lm.default_block_size  # MARS: the trained B
    assert ui.model_info(VERIFIED)[2] == 2 and ui.model_info(MARS)[2] == lm.default_block_size
    assert make_config("verified", 0.0, 4, 16).verify_groups == "last"
    session = Session()
    list(run(ui, session, tau=0.0, max_new=20, mode=VERIFIED))
    ids = encode_prompt(lm.tokenizer, PROMPT)
    ar = DecodeConfig(mode="ar", max_new_tokens=20, backend=app_backend())  # the app's model: its lossless promise
    assert session.mars.token_ids == generate_ids(lm, [ids], ar)[0].token_ids


def test_queued_visitors_see_their_place_in_the_queue_on_the_stats_tiles(lm):
    demo = app_module.create_demo(lambda: lm)
    stats_id = demo.mars_app.ui.stats._id
    dep = next(d for d in demo.config["dependencies"] if d.get("api_name") == "ui_generate")
    assert dep["show_progress"] == "minimal" and dep["show_progress_on"] == [stats_id]


# --------------------------------------------------------------------------------------------- memory


@pytest.mark.slow  # ~30-60 s on a quiet 2-core machine: the default run stays under ~15 min
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_memory_stays_flat_over_50_runs(ui, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    session = Session()
    for _ in range(5):  # warm-up: allocator pools, plotly's validators, Gradio's update objects
        list(run(ui, session, max_new=16, compare=True))
    gc.collect()
    before = rss_mb()
    for i in range(50):
        list(run(ui, session, prompt=f"{PROMPT} {i % 10}", max_new=16, compare=True))
    gc.collect()
    after = rss_mb()
    print(f"\nRSS over 50 runs (tiny model): {before:.1f} MB -> {after:.1f} MB")
    assert after - before < 15
    assert len(list(tmp_path.glob("mars-run-*"))) == 1  # a session keeps its last run's files only
    session.close()  # Gradio's delete_callback, once the visitor has gone
    assert not list(tmp_path.glob("mars-run-*"))


def test_the_app_runs_int8_by_default_and_says_so(lm, env):
    """The app's default backend is int8 on a CPU (issue 24); MARS_BACKEND chooses another, checked once."""
    from mars.runtime.backends import resolve_backend

    env.unset("MARS_BACKEND")
    assert app_backend() == "auto-int8" and resolve_backend(lm.model, app_backend()) == "fast-int8"
    ui = app_module.create_demo(lambda: lm).mars_app
    _, table, *_ = ui.model_info()
    assert "fast-int8" in table and "greedy text" in table
    session = Session()
    list(run(ui, session, max_new=8, compare=True))
    assert session.mars.config.backend == "fast-int8" and session.ar.config.backend == "fast-int8"
    env.set("MARS_BACKEND", "auto")
    assert make_config("mars", 0.9, 4, 8).backend == "auto"
    _, table, *_ = ui.model_info()
    assert "fast: float32" in table
    env.set("MARS_BACKEND", "static")  # what `auto` picks on a GPU: the panel names it too
    _, table, *_ = ui.model_info()
    assert "static: fixed shapes" in table
    env.set("MARS_BACKEND", "turbo")
    with pytest.raises(ValueError, match="MARS_BACKEND"):
        make_config("mars", 0.9, 4, 8)


def test_the_model_thread_serves_visitors_in_the_order_they_asked():
    """Passes are queued first come, first served: a visitor who asks again at once must not win over one
    already waiting (a plain lock let one visitor's whole run go first); two visitors' passes alternate."""
    from mars.app.model_thread import ModelThread

    mt = ModelThread()
    order, gate, running = [], threading.Event(), threading.Event()
    # a pass in flight (taken off the queue): both visitors queue behind it
    busy = threading.Thread(target=mt.call, args=(lambda: (running.set(), gate.wait()),))
    busy.start()
    assert running.wait(30)

    def visitor(name, passes):
        for _ in range(passes):
            mt.call(lambda: (order.append(name), time.sleep(0.002)))

    threads = []
    for name in "AB":
        threads.append(threading.Thread(target=visitor, args=(name, 20)))
        threads[-1].start()
        while mt._queue.qsize() < len(threads):  # this visitor's first pass is queued before the next one starts
            time.sleep(0.001)
    gate.set()
    for t in threads + [busy]:
        t.join(timeout=30)
    assert order == ["A", "B"] * 20  # strictly alternating: neither ever went twice while the other waited


def test_every_pass_runs_on_the_one_model_thread_whichever_worker_asks(monkeypatch):
    """OpenMP keeps a team per thread that opens parallel regions; two such threads on two cores made every
    pass ~3.5x dearer (mars.app.model_thread). So the holder runs each pass on its one model thread: two
    worker threads' runs, the warm-up and a call made from the model thread itself all run there, and an
    error in a pass reaches the worker that asked, leaving the thread serving."""
    from concurrent.futures import ThreadPoolExecutor

    ran_on, real = [], Scheduler.step

    def spy(self, *args, **kwargs):
        ran_on.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "step", spy)  # every pass, shared or not
    lm = make_loaded()
    holder = serving.ModelHolder(lambda: lm, threads=1)
    ids = encode_prompt(lm.tokenizer, PROMPT)
    cfg = DecodeConfig(mode="mars", tau=0.5, max_new_tokens=6)
    holder.get()  # the warm-up's passes
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(lambda: list(holder.passes(lm, ids, cfg, serving.DecodeControl()))) for _ in range(2)]
        workers = [pool.submit(threading.get_ident) for _ in range(4)]
        assert all(r.result() for r in runs)
    model = holder.pass_slot.thread.ident
    assert model is not None and set(ran_on) == {model}
    assert model not in {w.result() for w in workers} | {threading.get_ident()}
    assert holder.pass_slot.run(lambda: holder.pass_slot.run(threading.get_ident)) == model  # no deadlock
    with pytest.raises(ValueError, match="mask token"):
        list(holder.passes(make_loaded(mask=False), ids, cfg, serving.DecodeControl()))
    assert holder.pass_slot.run(threading.get_ident) == model  # still serving, on the same thread


def test_a_load_in_its_own_thread_sees_the_callers_context_and_raises_its_errors():
    """Model loads run on a thread that ends with them (their OpenMP team with it), in a copy of the caller's
    context: Gradio's progress bar finds its event through context variables."""
    import contextvars
    from mars.app.model_thread import in_own_thread

    var = contextvars.ContextVar("event", default=None)
    var.set("event-1")
    seen = in_own_thread(lambda: (var.get(), threading.current_thread().name))
    assert seen == ("event-1", "mars-load")
    with pytest.raises(LoadError, match="nope"):
        in_own_thread(lambda: (_ for _ in ()).throw(LoadError("nope")))


@pytest.mark.parametrize("value", ["x", -1, 10 ** 9, [4], 2.5])
def test_the_verified_apis_tree_nodes_are_checked_and_empty_means_the_pages(ui, value):
    with pytest.raises(gr.Error, match="tree nodes must be a whole number"):
        list(ui.api_generate_verified(PROMPT, None, 8, 0.0, value))
    *_, (_, trace) = ui.api_generate_verified(PROMPT, None, 8, 0.0, None)  # still serving; empty: the page's tree
    assert trace["settings"]["tree_nodes"] == app_tree_nodes()
