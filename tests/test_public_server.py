"""A public deployment, served for real on 127.0.0.1 (issue 25): on a server started with SPACE_ID set no
visitor can change the model by any route (the Model tab in Chromium, Gradio's REST API by name, the queue by
index, the direct route); the operator can with MARS_ADMIN_TOKEN; an oversized Hub model (a fake Hub's
metadata) is refused before its download; absent and forbidden folders read the same; and a flood of clients
beyond MARS_QUEUE_SIZE is told "busy, try again" while every client in the queue gets its exact output.

The policy itself, without a server: tests/test_policy.py.
"""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest

import app as app_module
from conftest import serve
from fake_hub import GB, FakeHub
from mars.app import serving
from mars.app.inputs import app_backend, sanitize_text
from mars.app.policy import Policy
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from tiny import make_loaded, save_tiny

TOKEN = "operator-token-0123456789"
BLK4 = "Xalphinions/MARS-Qwen2.5-0.5B-blk4"
PUBLIC = "This server is public"


class environ:
    """Set environment variables for a module-scoped server (monkeypatch is per test)."""

    def __init__(self, **values):
        self.values, self.old = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    save_tiny(root / "models" / "tiny2", seed=1)
    save_tiny(root / "outside", seed=2)
    return root / "models"


@pytest.fixture(scope="module")
def space(models_dir):
    """A Space without a token: SPACE_ID set, bound to loopback (as tests must), a models folder offered."""
    lm = make_loaded()
    with environ(SPACE_ID="someone/mars", MARS_MODELS_DIR=str(models_dir)):
        demo, url = serve(lambda: lm)
    yield demo, url, lm
    demo.close()


@pytest.fixture(scope="module")
def hub():
    fake = FakeHub({"big/model": {"files": {"model.safetensors": 2000 * GB, "config.json": 700}, "params": 10 ** 12}})
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def operated(models_dir, hub):
    """A Space whose operator set MARS_ADMIN_TOKEN, allows a too-large Hub model, and offers a models folder."""
    lm = make_loaded()
    with environ(SPACE_ID="someone/mars", MARS_MODELS_DIR=str(models_dir), MARS_ADMIN_TOKEN=TOKEN,
                 MARS_ALLOWED_MODELS=f"smollm2, {BLK4}, big/model"):
        policy = Policy.from_env(hub_info=hub.model_info)
    demo = app_module.create_demo(lambda: lm, policy)
    demo.mars_app.holder.get()
    port = serving.free_port()
    app_module.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield demo, f"http://127.0.0.1:{port}/", lm
    demo.close()


def dependency(demo, api_name):
    return next(d for d in demo.config["dependencies"] if d.get("api_name") == api_name)


def call_by_name(url, api_name, data) -> str:
    """Gradio's REST route for an event by name (private events too): the first output of its last event."""
    call = f"{url}gradio_api/call/{api_name}"
    event = httpx.post(call, json={"data": data}, timeout=10).json()["event_id"]
    lines = httpx.get(f"{call}/{event}", timeout=60).text.strip().splitlines()
    payloads = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    return str(payloads[-1][0] if isinstance(payloads[-1], list) else payloads[-1])


def call_by_index(demo, url, api_name, data) -> str:
    """The browser's own queue protocol: join by fn_index, read the stream to its end."""
    dep = dependency(demo, api_name)
    session = f"s-{api_name}-{time.monotonic_ns()}"
    body = {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None,
            "trigger_id": dep["targets"][0][0]}
    assert httpx.post(f"{url}gradio_api/queue/join", json=body, timeout=10).status_code == 200
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}, timeout=60) as r:
        for line in r.iter_lines():
            if '"process_completed"' in line:
                msg = json.loads(line[len("data: "):])
                return json.dumps(msg["output"])
    raise AssertionError("no answer")


def call_direct(url, api_name, data) -> str:
    r = httpx.post(f"{url}gradio_api/run/{api_name}", json={"data": data}, timeout=60)
    return r.text


def test_on_a_space_no_route_changes_the_model(space):
    demo, url, lm = space
    assert demo.mars_app.live_policy().switch_mode == "closed"
    routes = {  # every event that can switch, by every route Gradio serves it on
        "load_model": [["tiny2", "", TOKEN], [BLK4, "", ""], ["smollm2", "", None]],
        "load": [[BLK4, TOKEN], ["smollm2", ""]],  # the paper list's Load
    }
    for api_name, calls in routes.items():
        for data in calls:
            assert PUBLIC in call_by_name(url, api_name, data)
            assert PUBLIC in call_by_index(demo, url, api_name, data)
            direct = call_direct(url, api_name, data)  # refused by Gradio itself (queued events), or by the handler
            assert PUBLIC in direct or "join the queue" in direct
    assert demo.mars_app.holder.loaded is lm
    text, _ = serving_answer(url)
    assert text  # and it still serves


def serving_answer(url, prompt="what is the capital of france ?", tau=0.9, max_new=8):
    from gradio_client import Client

    return Client(url, verbose=False).predict(prompt, tau, 4, max_new, api_name="/generate")


def model_tab(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#model-banner b", timeout=120_000)
    page.get_by_role("tab", name="Model").click()
    page.wait_for_selector("#model-help", timeout=30_000)
    return page


def test_on_a_space_the_model_tab_offers_links_not_controls(browser, space):
    demo, url, lm = space
    page = model_tab(browser, url)
    help_text = page.inner_text("#model-help")
    assert PUBLIC in help_text and "run the app on your own machine" in help_text
    assert "git clone https://huggingface.co/spaces/someone/mars" in help_text
    assert page.locator(f'#paper-links a[href="https://huggingface.co/{BLK4}"]').count() == 1
    for hidden in ("#model-id", "#load-model", "#admin-token", "#load-paper", "#paper-checkpoint"):
        assert not page.locator(hidden).is_visible(), hidden
    assert "tiny-llama" in page.inner_text("#model-info")  # the current model
    page.close()


def load_in_page(page, name, token=None, adapter="") -> str:
    page.fill("#admin-token input", token or "")
    page.fill("#model-adapter input, #model-adapter textarea", adapter)
    page.fill("#model-id input, #model-id textarea", name)
    shown = "#model-message :is(.mars-note, .mars-banner)"
    before = page.inner_text(shown) if page.locator(shown).count() else ""  # each call expects a new message
    page.click("#load-model")
    page.wait_for_function("([sel, b]) => { const e = document.querySelector(sel); "
                           "return e !== null && e.innerText.trim() !== b.trim(); }", arg=[shown, before],
                           timeout=60_000)
    return page.inner_text(shown)


def test_the_operator_with_the_token_can_and_nobody_else(browser, operated, hub, models_dir):
    demo, url, lm = operated
    page = model_tab(browser, url)
    assert page.locator("#admin-token").is_visible() and page.locator("#model-id").is_visible()
    assert "needs the operator token (no token was given)" in load_in_page(page, "tiny2")
    assert "needs the operator token (the token given is not it)" in load_in_page(page, "tiny2", "guess" * 4)
    assert demo.mars_app.holder.loaded is lm
    # the paper list's Load button sends the token too
    page.fill("#admin-token input", "")
    page.click("#load-paper")
    page.wait_for_function("document.querySelector('#paper-message').innerText.includes('operator token')",
                           timeout=60_000)

    # an oversized Hub model, allowed by name, is refused from the Hub's metadata: nothing downloaded
    message = load_in_page(page, "big/model", TOKEN)
    assert "big/model needs about 3725.3 GB of memory" in message and "refused before any download" in message
    assert hub.requests and hub.downloads == []

    # an absent folder and a forbidden one read the same
    outside = str(models_dir.parent / "outside")
    absent = load_in_page(page, "absent", TOKEN)
    forbidden = load_in_page(page, outside, TOKEN)
    assert "is not offered on this server" in absent
    assert absent.replace("'absent'", "NAME") == forbidden.replace(f"'{outside}'", "NAME").replace("'outside'", "NAME")
    assert "is not offered" in load_in_page(page, "tiny2", TOKEN, adapter=outside)  # adapters too

    # the operator's load goes through, and every visitor's page names the new model
    assert load_in_page(page, "tiny2", TOKEN) == "Loaded tiny2."
    assert demo.mars_app.holder.loaded is not lm and demo.mars_app.holder.loaded.name.endswith("tiny2")
    page.wait_for_function("document.querySelector('#model-banner').innerText.includes('tiny2')", timeout=30_000)
    page.close()


def test_the_operator_token_over_the_api(operated):
    demo, url, _ = operated
    assert "needs the operator token" in call_by_name(url, "load_model", ["tiny2", "", "wrong" * 4])
    assert "needs the operator token" in call_by_index(demo, url, "load", [BLK4, None])
    assert call_by_name(url, "load_model", ["tiny2", "", TOKEN]) == '<div class="mars-note">Loaded tiny2.</div>'


# ----------------------------------------------------------------------------------------------- the flood


def alone(lm, prompt, tau, max_new):
    ids = encode_prompt(lm.tokenizer, sanitize_text(prompt))
    cfg = DecodeConfig(mode="mars", tau=tau, max_new_tokens=max_new, block_size=4, backend=app_backend())  # the app's
    return generate_ids(lm, [ids], cfg)[0].text


def flood(url, clients: int, max_new: int, deadline_s: float) -> dict:
    """`clients` clients call /generate at once, each with its own prompt and tau; each either gets its text
    or the queue's refusal. Returns the figures and each served client's text."""
    prompts = [(f"client {i} asks: what is the capital of france ?", round(0.1 + 0.8 * (i % 9) / 8, 2))
               for i in range(clients)]
    got, refused, errors = {}, [], []
    start = threading.Barrier(clients)

    def client(i):
        prompt, tau = prompts[i]
        call = f"{url}gradio_api/call/generate"
        try:
            start.wait(timeout=30)
            r = httpx.post(call, json={"data": [prompt, tau, 4, max_new]}, timeout=30)
            if r.status_code == 503:
                refused.append(r.json()["detail"])
                return
            event = r.json()["event_id"]
            lines = httpx.get(f"{call}/{event}", timeout=deadline_s).text.strip().splitlines()
            events = [line[len("event: "):] for line in lines if line.startswith("event: ")]
            data = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
            if events[-1] != "complete":
                errors.append(f"{events[-1]}: {data[-1]}")
                return
            got[i] = data[-1][0]
        except Exception as e:  # noqa: BLE001 - counted and shown
            errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    [t.start() for t in threads]
    [t.join(timeout=deadline_s) for t in threads]
    return {"clients": clients, "refused": refused, "served": got, "errors": errors, "prompts": prompts,
            "alive": sum(t.is_alive() for t in threads), "seconds": time.perf_counter() - t0}


def slow_backend(delay: float):
    """The decoder's default backend, `delay` s slower per pass: handed to the served app's holder, so that
    runs last long enough for its queue to fill."""
    from mars.decoding.decoder import make_runner

    def make(model, cfg, batch, capacity):
        runner = make_runner(model, cfg, batch, capacity)
        forward = runner.forward

        def slow_forward(*args, **kwargs):
            time.sleep(delay)
            return forward(*args, **kwargs)

        runner.forward = slow_forward
        return runner

    return make


@pytest.mark.parametrize("clients,queue_size", [
    (32, 4),
    pytest.param(256, 16, marks=pytest.mark.slow),
])
def test_a_flood_beyond_the_queue_is_told_busy_and_the_queue_is_served_exactly(clients, queue_size, env):
    lm = make_loaded()
    env.set("MARS_QUEUE_SIZE", str(queue_size))
    env.set("MARS_CONCURRENCY", "2")
    demo, url = serve(lambda: lm)
    demo.mars_app.holder.backend = slow_backend(0.02)  # ~20 ms a pass: runs last long enough for the queue to fill
    try:
        out = flood(url, clients, max_new=24, deadline_s=300)
        refused, served, errors = out["refused"], out["served"], out["errors"]
        print(f"\nflood: {clients} clients, queue size {queue_size}, concurrency 2: {len(refused)} refused "
              f"('busy'), {len(served)} served, {len(errors)} errors, {out['seconds']:.1f} s")
        assert out["alive"] == 0 and errors == []
        assert len(refused) + len(served) == clients
        # the queue and a running slot, then refusals: the burst can fill the queue before the second of the two
        # running slots has taken its event (seen once in CI: 5 served with a queue of 4), so one is all it may hold
        assert len(served) >= queue_size + 1 and refused
        assert all(r.startswith("Queue is full.") for r in refused)
        for i, text in served.items():  # every served client gets exactly its own solo output
            prompt, tau = out["prompts"][i]
            assert text == alone(lm, prompt, tau, 24), i
        # the server stays up: after the flood, a client is served as usual
        prompt, tau = out["prompts"][0]
        assert serving_answer(url, prompt, tau, 24)[0] == alone(lm, prompt, tau, 24)
    finally:
        demo.close()


def test_a_full_queue_says_busy_try_again_to_clients_and_in_the_page(browser, env):
    """What a refused visitor reads: gradio_client's QueueError and the page's toast both say to try again."""
    from gradio_client.utils import QueueError

    lm = make_loaded()
    lm.model.generation_config.eos_token_id = []  # runs last until max new tokens
    env.set("MARS_QUEUE_SIZE", "1")
    env.set("MARS_CONCURRENCY", "1")  # without batching
    env.set("MARS_BATCH_ROWS", "1")  # with it (the default)
    demo, url = serve(lambda: lm)
    demo.mars_app.holder.backend = slow_backend(0.05)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#model-banner b", timeout=120_000)
        page.fill("#prompt textarea", "what is the capital of france ?")
        call = f"{url}gradio_api/call/generate"
        for _ in range(2):  # one running, one waiting: the queue is full
            assert httpx.post(call, json={"data": ["hi", 0.9, 4, 200]}, timeout=10).status_code == 200
        time.sleep(0.5)
        with pytest.raises(QueueError, match="Please try again"):
            serving_answer(url)
        page.click("#generate")
        page.wait_for_function("document.body.innerText.includes('currently busy. Please try again')",
                               timeout=30_000)
        page.close()
    finally:
        demo.close()
