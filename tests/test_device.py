"""One device setting everywhere: --device on every command, MARS_DEVICE for the app, clear messages for a
missing GPU and for running out of GPU memory, MARS_GGUF, and the trainer's batch on the device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mars.runtime.backends import FastBackend, HFBackend
from mars.models.device import DeviceError, default_dtype, env_device, is_oom, resolve_device
from mars.models.loading import LoadError, load, locate_default_gguf
from mars.settings import SettingsError

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
NO_GPU = not torch.cuda.is_available()


def run_cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "mars", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, **(env or {})}, timeout=timeout)


def test_auto_is_cuda_only_where_there_is_one_and_the_default_dtype_follows():
    assert resolve_device("auto", available=lambda: True) == "cuda"
    assert resolve_device(None, available=lambda: False) == "cpu"
    assert resolve_device("cpu", available=lambda: True) == "cpu"
    assert resolve_device(" CUDA ", available=lambda: True) == "cuda"
    assert (default_dtype("cuda"), default_dtype("cpu")) == ("bfloat16", "float32")
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        resolve_device("cuda", available=lambda: False)
    with pytest.raises(DeviceError, match="one of auto, cpu, cuda"):
        resolve_device("tpu")


def test_mars_device_is_read_and_checked(env):
    env.set("MARS_DEVICE", "cpu")
    assert env_device() == "cpu"
    env.unset("MARS_DEVICE")
    assert env_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    env.set("MARS_DEVICE", "cuda")
    if not torch.cuda.is_available():  # a device this machine lacks: the model load's message
        with pytest.raises(DeviceError, match="MARS_DEVICE='cuda': --device cuda: no CUDA GPU"):
            env_device()
    env.set("MARS_DEVICE", "gpu0")  # no device at all: the settings' message (mars.settings), at start-up
    with pytest.raises(SettingsError, match="MARS_DEVICE must be one of auto, cpu, cuda, got 'gpu0'"):
        env_device()


@pytest.mark.skipif(not NO_GPU, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("command", [
    ["generate", "hi"], ["bench", "--prompts", "data/prompts/heldout.jsonl"], ["eval"],
    ["calibrate", "--out", "runs/never"], ["train", "--data", "x.jsonl", "--out", "runs/never"]])
def test_device_cuda_without_cuda_is_one_line(command):
    out = run_cli(*command, "--device", "cuda", timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --device cuda: no CUDA GPU"), out.stderr


@pytest.mark.skipif(not NO_GPU, reason="checks the message on a machine without CUDA")
def test_load_refuses_cuda_before_loading_anything(tmp_path):
    with pytest.raises(DeviceError, match="no CUDA GPU"):  # a missing folder would be another LoadError
        load(str(tmp_path / "missing"), device="cuda")


def test_out_of_gpu_memory_is_one_clear_line(tiny_dir, monkeypatch, capsys):
    """The CLI's edge turns torch's OOM error into one line (the forward is patched to raise it)."""
    from mars import cli

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert is_oom(oom) and not is_oom(RuntimeError("other"))

    def boom(*a, **k):
        raise oom

    for backend in (HFBackend, FastBackend):  # whichever runs the model: its forward runs out of memory
        monkeypatch.setattr(backend, "forward", boom)
    rc = cli.main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--device", "cpu",
                   "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if ln.strip() and "Loading weights" not in ln]  # not transformers' bar
    assert rc == 3 and len(said) == 1 and said[0].startswith("error: out of GPU memory"), err
    assert "Traceback" not in err and "--batch" in said[0]


def test_other_errors_still_raise(tiny_dir, monkeypatch):
    """Only OOM is turned into a message: a real bug keeps its traceback."""
    from mars import cli

    def boom(*a, **k):
        raise RuntimeError("a bug")

    for backend in (HFBackend, FastBackend):
        monkeypatch.setattr(backend, "forward", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--device", "cpu"])


def test_cli_device_cpu_and_auto_give_the_same_text(tiny_dir):
    args = ["generate", "hello there", "--model", str(tiny_dir), "--tau", "1.0", "--json", "--max-new-tokens", "6"]
    a = run_cli(*args, "--device", "cpu")
    b = run_cli(*args) if NO_GPU else a  # auto = cpu here
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["token_ids"] == json.loads(b.stdout)["token_ids"]


def test_describe_names_the_device_and_dtype(tiny_dir):
    lm = load(str(tiny_dir), device="cpu")
    d = lm.describe()
    assert d["device"] == "cpu" and d["dtype"] == "float32"  # float32: the CPU's default
    assert load(str(tiny_dir), dtype="bfloat16").describe()["dtype"] == "bfloat16"


def test_mars_gguf_names_the_default_models_file(tmp_path, env):
    wheel = locate_default_gguf()
    env.set("MARS_GGUF", str(wheel))
    assert locate_default_gguf() == wheel
    env.set("MARS_GGUF", str(tmp_path / "nothing.gguf"))
    with pytest.raises(LoadError, match="MARS_GGUF=.*is not a file"):
        locate_default_gguf()


def test_app_provider_uses_mars_device_and_shows_it(tiny_dir, env):
    from mars.app.serving import default_provider

    env.set("MARS_MODEL", str(tiny_dir))
    env.set("MARS_ADAPTER", "none")
    env.set("MARS_DEVICE", "cpu")
    assert default_provider()().describe()["device"] == "cpu"
    env.set("MARS_DEVICE", "cuda" if NO_GPU else "tpu")
    with pytest.raises((DeviceError, SettingsError), match="MARS_DEVICE"):
        default_provider()()


def test_app_model_panel_shows_the_device(tiny_lm):
    import app

    banner, table, *_ = app.MarsApp(lambda: tiny_lm).model_info()
    assert "device" in table and "cpu" in table


def test_app_turns_out_of_gpu_memory_into_one_sentence(tiny_lm, monkeypatch):
    import gradio as gr

    import app

    demo = app.MarsApp(lambda: tiny_lm)
    demo._lm()  # loaded and warmed up before the forward breaks

    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    for backend in (HFBackend, FastBackend):  # whichever runs the model: its forward runs out of memory
        monkeypatch.setattr(backend, "forward", boom)
    with pytest.raises(gr.Error, match="The run failed: out of GPU memory: try fewer new tokens"):
        list(demo._api_run("mars", "hello", 0.9, 4, 8))
