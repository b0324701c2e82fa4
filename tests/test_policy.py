"""Who may change the shared model and what may load (issue 25), without a browser: the policy read from the
environment, the token, the allow-list, the models folder, and sizing before any download against a fake Hub.
The same rules over HTTP, the queue and in Chromium: tests/test_public_server.py."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest

import app as app_module
from fake_hub import GB, FakeHub
from mars.app import serving
from mars.app.policy import DEFAULT_ALLOWED, Policy, PolicyError, is_loopback
from mars.app.serving import load_other, vet_switch
from mars.models import sizing
from mars.models.sizing import SizeError, WeightsSize
from tiny import make_loaded, save_tiny

TOKEN = "operator-token-0123456789"
BLK4 = "Xalphinions/MARS-Qwen2.5-0.5B-blk4"


@pytest.fixture()
def models_dir(tmp_path):
    """An operator's models folder with one tiny model and, beside it (outside), another one."""
    root = tmp_path / "models"
    save_tiny(root / "tiny2", seed=1)
    save_tiny(tmp_path / "outside", seed=2)
    return root


@pytest.fixture()
def hub():
    fake = FakeHub({
        "big/model": {"files": {"model.safetensors": 2000 * GB, "config.json": 700}, "params": 10 ** 12},
        "wide/disk": {"files": {"model-00001.safetensors": 10 ** 6 * GB}, "params": 1000},
        "small/model": {"files": {"model.safetensors": 416_608, "config.json": 700}, "params": 103_616},
        "pickled/model": {"files": {"pytorch_model.bin": 1000}, "params": None},
    })
    yield fake
    fake.close()


def test_loopback_is_this_machine_only():
    for host in ("127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", None, "192.168.1.5", "10.0.0.1", "example.com", "localhost.evil.com"):
        assert not is_loopback(host), host


@pytest.mark.parametrize("env,mode", [
    ({}, "open"),  # a laptop: Gradio binds 127.0.0.1 unless told otherwise
    ({"GRADIO_SERVER_NAME": "127.0.0.1"}, "open"),
    ({"GRADIO_SERVER_NAME": "::1"}, "open"),
    ({"SPACE_ID": "someone/mars"}, "closed"),  # Hugging Face sets it on every Space
    ({"SPACE_ID": "someone/mars", "GRADIO_SERVER_NAME": "127.0.0.1"}, "closed"),
    ({"GRADIO_SERVER_NAME": "0.0.0.0"}, "closed"),
    ({"GRADIO_SERVER_NAME": "192.168.1.5"}, "closed"),
    ({"GRADIO_SHARE": "true"}, "closed"),
    ({"MARS_PUBLIC": "1"}, "closed"),  # loopback behind a reverse proxy
    ({"MARS_ADMIN_TOKEN": TOKEN}, "token"),
    ({"MARS_ADMIN_TOKEN": TOKEN, "SPACE_ID": "someone/mars"}, "token"),
])
def test_who_may_switch_follows_the_deployment(env, mode):
    policy = Policy.from_env(env)
    assert policy.switch_mode == mode
    ok, message = policy.may_switch(None)
    assert ok is (mode == "open")
    if mode == "closed":
        assert message.startswith("This server is public") and "no visitor can change it" in message


def test_the_real_bind_address_decides_not_the_environment():
    policy = Policy.from_env({})
    assert policy.switch_mode == "open"
    assert policy.bound_to(("0.0.0.0",), False).switch_mode == "closed"
    assert policy.bound_to(("127.0.0.1", "0.0.0.0"), False).switch_mode == "closed"  # SSR's node server
    assert policy.bound_to(("127.0.0.1",), True).switch_mode == "closed"  # share link


def test_the_token_opens_switching_compared_in_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    policy = Policy.from_env({"MARS_ADMIN_TOKEN": TOKEN, "SPACE_ID": "someone/mars"})
    assert policy.may_switch(TOKEN) == (True, "")
    assert calls
    for wrong in (None, "", TOKEN[:-1], TOKEN + "x", 12, ["x"], "\ud800"):
        ok, message = policy.may_switch(wrong)
        assert not ok and "needs the operator token" in message
    assert "no token was given" in policy.may_switch("")[1] and "is not it" in policy.may_switch("nope")[1]
    assert TOKEN not in repr(policy)  # never in a log line


@pytest.mark.parametrize("env,match", [
    ({"MARS_ADMIN_TOKEN": "short"}, "at least 16 characters"),
    ({"MARS_ALLOWED_MODELS": "ok/model, ../etc"}, "not a Hub id"),
    ({"MARS_QUEUE_SIZE": "many"}, "MARS_QUEUE_SIZE must be a whole number"),
    ({"MARS_QUEUE_SIZE": "0"}, "MARS_QUEUE_SIZE must be a whole number of 1 or more, got '0'"),
    ({"MARS_MODELS_DIR": "/no/such/folder"}, "is not a folder"),
])
def test_bad_settings_stop_the_server_with_a_message(env, match):
    with pytest.raises(ValueError, match=match):
        Policy.from_env(env)


def test_hub_models_only_from_the_allow_list():
    policy = Policy.from_env({})
    assert policy.allowed_models == DEFAULT_ALLOWED and "smollm2" in DEFAULT_ALLOWED and BLK4 in DEFAULT_ALLOWED
    assert policy.check_model_request(BLK4).kind == "hub"
    assert policy.check_model_request(" smollm2 ").kind == "default"
    for name in ("someone/some-model", "Xalphinions/MARS-Qwen2.5-0.5B-BD3LM-blk4", "x" * 5000, "smollm"):
        with pytest.raises(PolicyError, match="is not offered on this server: it loads the Hub ids on its list"):
            policy.check_model_request(name)
    with pytest.raises(PolicyError, match="Give a Hub id"):
        policy.check_model_request(["a"])
    listed = Policy.from_env({"MARS_ALLOWED_MODELS": "a/b, c/d"})
    assert listed.allowed_models == ("a/b", "c/d")
    with pytest.raises(PolicyError):
        listed.check_model_request("smollm2")  # the operator's list is the whole list
    anything = Policy.from_env({"MARS_ALLOWED_MODELS": "*"})
    assert anything.check_model_request("someone/some-model").kind == "hub"
    with pytest.raises(PolicyError, match="it loads any Hub id"):
        anything.check_model_request("../../etc/passwd")


def test_folders_only_under_the_models_folder_with_one_message(models_dir, monkeypatch):
    policy = Policy.from_env({"MARS_MODELS_DIR": str(models_dir)})
    inside = policy.check_model_request("tiny2")
    assert inside.kind == "folder" and Path(inside.name) == (models_dir / "tiny2").resolve()
    assert policy.check_model_request(str(models_dir / "tiny2")).name == inside.name  # absolute, within
    outside = str(models_dir.parent / "outside")  # exists, but outside the folder
    assert Path(outside, "config.json").is_file()
    messages = {}
    for name in (outside, "../outside", str(models_dir / "absent"), "absent", "/etc", "~/x", "tiny2/../../outside",
                 str(models_dir)):
        with pytest.raises(PolicyError) as err:
            policy.check_model_request(name)
        messages[name] = str(err.value).replace(repr(name), "NAME")
    assert len(set(messages.values())) == 1, messages  # absent and forbidden read the same
    assert "folders in its models folder" in next(iter(messages.values()))
    # nothing outside the folder is ever looked at: decided by path arithmetic before any file system call
    seen = []
    for method in ("resolve", "is_dir", "exists", "stat"):
        real = getattr(Path, method)
        monkeypatch.setattr(Path, method, lambda self, *a, _real=real, **k: seen.append(str(self)) or _real(self, *a, **k))
    for name in (outside, "../outside", "/etc", "tiny2/../../outside"):
        with pytest.raises(PolicyError):
            policy.check_model_request(name)
    assert seen == []


def test_a_link_inside_the_folder_cannot_lead_outside(models_dir):
    (models_dir / "escape").symlink_to(models_dir.parent / "outside")
    policy = Policy.from_env({"MARS_MODELS_DIR": str(models_dir)})
    with pytest.raises(PolicyError, match="is not offered"):
        policy.check_model_request("escape")
    assert Policy.from_env({}).models_dir is None
    with pytest.raises(PolicyError, match="it loads the Hub ids on its list. The"):  # no folders at all
        Policy.from_env({}).check_model_request(str(models_dir / "tiny2"))


def test_adapters_only_under_the_models_folder(models_dir):
    policy = Policy.from_env({"MARS_MODELS_DIR": str(models_dir)})
    for given, want in ((None, "auto"), ("", "auto"), (" auto ", "auto"), ("None", "none")):
        assert policy.check_adapter(given) == want
    assert policy.check_adapter("tiny2") == str((models_dir / "tiny2").resolve())
    for name in (str(models_dir.parent / "outside"), "absent", "/tmp"):
        with pytest.raises(PolicyError, match=r"^Adapter .* is not offered on this server"):
            policy.check_adapter(name)


# ------------------------------------------------------------------------------------------------- sizing


def test_an_oversized_hub_model_is_refused_before_its_download(hub):
    policy = Policy.from_env({"MARS_ALLOWED_MODELS": "big/model, wide/disk, small/model, pickled/model, no/model"},
                             hub_info=hub.model_info)

    def never(*a):
        raise AssertionError("no load may start")

    lm, message = load_other("big/model", "", policy, load_fn=never)
    assert lm is None and "big/model needs about 3725.3 GB of memory (1000.00B parameters as float32)" in message
    assert "refused before any download" in message and "keeps serving" in message
    lm, message = load_other("wide/disk", "", policy, load_fn=never)
    assert lm is None and "would download 931322.6 GB of weights" in message and "disk" in message
    lm, message = load_other("pickled/model", "", policy, load_fn=never)
    assert lm is None and "has no safetensors weights" in message
    lm, message = load_other("no/model", "", policy, load_fn=never)
    assert lm is None and "could not read no/model's file sizes" in message and "RepositoryNotFound" in message
    assert hub.requests and hub.downloads == []  # metadata only: no file was fetched
    loaded = make_loaded()
    lm, message = load_other("small/model", "", policy, load_fn=lambda name, adapter: loaded)
    assert lm is loaded and message == "Loaded tiny-llama."


def test_the_fake_hub_is_reached_whatever_the_callers_hub_mode(tmp_path):
    """A shell with HF_HUB_OFFLINE=1 once made the test above fail: huggingface_hub then refuses the fake Hub too.
    tests/conftest.py starts every run online; this runs that test as such a shell would."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    test = "tests/test_policy.py::test_an_oversized_hub_model_is_refused_before_its_download"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", test], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]


def test_memory_is_counted_as_float32_and_both_limits_hold():
    size = WeightsSize("m", params=10 ** 9, weight_bytes=2 * 10 ** 9, download_bytes=2 * 10 ** 9)
    assert size.memory_bytes == 4 * 10 ** 9
    assert WeightsSize("m", None, 10 ** 9, 0).memory_bytes == 2 * 10 ** 9  # no count: read as 16-bit
    plenty = lambda: 100 * GB  # noqa: E731
    sizing.check_fits(size, plenty, plenty)
    with pytest.raises(SizeError, match="memory"):
        sizing.check_fits(size, lambda: 4 * 10 ** 9, plenty)  # the reserve does not fit beside it
    with pytest.raises(SizeError, match="disk"):
        sizing.check_fits(size, plenty, lambda: 2 * 10 ** 9)
    sizing.check_fits(WeightsSize("m", 10, 40, 0), plenty, lambda: 0)  # cached: nothing to download
    assert sizing.free_memory_bytes() > 0 and sizing.free_disk_bytes(Path("/no/such/dir")) > 0


def test_a_folder_is_sized_from_its_safetensors_headers(models_dir, tmp_path):
    size = sizing.folder_weights_size(models_dir / "tiny2")
    lm = make_loaded(seed=1)
    # the file holds each tensor once: tied embeddings are one tensor there
    assert size.params == sum(p.numel() for p in {id(p): p for p in lm.model.parameters()}.values())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(SizeError, match="not a readable safetensors file"):
        sizing.folder_weights_size(bad)


def test_a_cached_hub_model_is_sized_from_disk_with_no_hub(models_dir, monkeypatch):
    policy = Policy.from_env({"MARS_ALLOWED_MODELS": "cached/model"})
    monkeypatch.setattr(serving, "cached_snapshot", lambda repo: models_dir / "tiny2")

    def unreachable():
        raise AssertionError("a cached model needs no Hub")

    request, adapter = vet_switch(policy, None, "cached/model", reachable=unreachable, cached=lambda name: True)
    assert request.name == "cached/model" and adapter == "none"
    # only the config cached: the weights would download, so the Hub must size them
    monkeypatch.setattr(serving, "cached_snapshot", lambda repo: models_dir.parent)
    with pytest.raises(PolicyError, match="no network access"):
        vet_switch(policy, None, "cached/model", reachable=lambda: False, cached=lambda name: True)


# ------------------------------------------------------------------------------------ the app's handlers


def test_on_a_space_no_handler_can_switch_and_the_operator_can(models_dir, monkeypatch, env):
    lm = make_loaded()
    monkeypatch.setenv("SPACE_ID", "someone/mars")
    env.set("MARS_MODELS_DIR", str(models_dir))
    ui = app_module.create_demo(lambda: lm).mars_app
    ui.holder.get()
    paper = ui.ui.paper.loader
    for name in ("tiny2", BLK4, "smollm2"):
        message, *_ = ui.load_model(name, "", TOKEN)
        assert "This server is public" in message and ui.holder.loaded is lm
        assert "This server is public" in paper(name, TOKEN, progress=lambda *a, **k: None)
        assert ui.holder.loaded is lm
    help_text, controls, token_box, links = ui.model_tab_view()
    assert "run the app on your own machine" in help_text and "huggingface.co/spaces/someone/mars" in help_text
    assert controls["visible"] is False and token_box["visible"] is False and links["visible"] is True

    env.set("MARS_ADMIN_TOKEN", TOKEN)
    ui = app_module.create_demo(lambda: lm).mars_app
    ui.holder.get()
    message, *_ = ui.load_model("tiny2", "", "wrong-token")
    assert "needs the operator token" in message and ui.holder.loaded is lm
    assert "needs the operator token" in paper_of(ui)("smollm2", None, progress=lambda *a, **k: None)
    message, banner, *_ = ui.load_model("tiny2", "", TOKEN)
    assert message == '<div class="mars-note">Loaded tiny2.</div>' and ui.holder.loaded is not lm and "tiny2" in banner
    assert "is not offered" in paper_of(ui)("tiny2", TOKEN, progress=lambda *a, **k: None)  # the list: Hub only
    _, controls, token_box, links = ui.model_tab_view()
    assert controls["visible"] is True and token_box["visible"] is True and links["visible"] is False


def paper_of(ui):
    return ui.ui.paper.loader


def test_loads_run_one_at_a_time_whichever_button():
    """Each load is sized against what is free while no other load runs: both Load events share one slot."""
    demo = app_module.create_demo(lambda: make_loaded())
    deps = [next(d for d in demo.config["dependencies"] if d.get("api_name") == n) for n in ("load_model", "load")]
    fns = [demo.fns[d["id"]] for d in deps]
    assert {f.concurrency_id for f in fns} == {"model-switch"} and {f.concurrency_limit for f in fns} == {1}
