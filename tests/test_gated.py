"""The gated adapter (issue 13, item 5): LoRA deltas only at mask-token rows.

Real tokens then run the bare model, so tau = 1.0 and the verified mode give the bare model's greedy output
token for token, in both backends, while the drafts at mask rows do change; the two-forward training
layout equals the one-forward layout."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.models.loading import AdapterError, load
from mars.training.objective import Example, build_batch, forward_batch, gated_forward
from tiny import random_lora

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["what is the capital of france ?", "add 2 + 3 = ?", "tell me a word about the water"]


@pytest.fixture(scope="module")
def gated_dir(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gated") / "adapter"
    bare = load(str(tiny_dir), dtype="float64")
    random_lora(bare.model).save_pretrained(out, safe_serialization=True)
    (out / "mars.json").write_text(json.dumps({"gated": True, "block_size": 4, "mask_token": "<|mask|>",
                                               "base_model": str(tiny_dir)}))
    return out


@pytest.fixture(scope="module")
def pair(tiny_dir, gated_dir):
    return load(str(tiny_dir), dtype="float64"), load(str(tiny_dir), adapter=str(gated_dir), dtype="float64")


def hf_greedy(lm, ids, n):
    x = torch.tensor([ids])
    return lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()


def test_a_gated_adapter_is_attached_not_merged_and_acts_only_at_mask_rows(pair):
    bare, gated = pair
    assert gated.gated and not bare.gated and gated.describe()["gated"] is True
    ids = encode_prompt(gated.tokenizer, PROMPTS[0])
    x = torch.tensor([ids + [gated.mask_token_id] * 3])
    with torch.no_grad():
        lb, lg = bare.model(input_ids=x).logits, gated.model(input_ids=x).logits
    n = len(ids)
    assert torch.equal(lb[:, :n], lg[:, :n])  # real rows: the bare model, bit for bit
    assert (lb[:, n:] - lg[:, n:]).abs().max() > 1e-2  # mask rows: the adapter's drafts


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_tau1_and_verified_equal_the_bare_models_greedy_output(pair, backend):
    bare, gated = pair
    changed = 0
    for p in PROMPTS:
        ids = encode_prompt(gated.tokenizer, p)
        ref = hf_greedy(bare, ids, 30)
        for cfg in (DecodeConfig(mode="mars", tau=1.0, block_size=4, max_new_tokens=30, backend=backend),
                    DecodeConfig(mode="verified", tau=0.0, block_size=4, max_new_tokens=30, backend=backend),
                    DecodeConfig(mode="ar", max_new_tokens=30, backend=backend)):
            assert generate_ids(gated, [ids], cfg)[0].token_ids == ref, (p, cfg.mode)
        low = DecodeConfig(mode="mars", tau=0.0, block_size=4, max_new_tokens=30, backend=backend)
        changed += generate_ids(gated, [ids], low)[0].token_ids != generate_ids(bare, [ids], low)[0].token_ids
    assert changed  # the drafts are the adapter's: accepting them blindly changes the text


def test_the_fast_path_applies_the_gate_as_transformers_does(pair):
    _, gated = pair
    ids = [encode_prompt(gated.tokenizer, p) for p in PROMPTS]
    for tau in (0.9, 0.3):
        runs = {b: generate_ids(gated, ids, DecodeConfig(mode="mars", tau=tau, block_size=4, max_new_tokens=24,
                                                         backend=b)) for b in ("hf", "fast")}
        for h, f in zip(runs["hf"], runs["fast"]):
            assert h.token_ids == f.token_ids
            assert [len(s.token_ids) for s in h.steps] == [len(s.token_ids) for s in f.steps]


def test_two_forward_training_layout_equals_the_one_forward_layout(tiny_lm):
    from mars.models.gated import gate_peft_model

    model = random_lora(copy.deepcopy(tiny_lm.model), seed=1)  # a copy: the session's tiny model stays bare
    gate_peft_model(model, tiny_lm.mask_token_id)
    tok = tiny_lm.tokenizer
    exs = [Example(encode_prompt(tok, p), tok("the capital is paris . it is big")["input_ids"] + [3])
           for p in PROMPTS]
    batch = build_batch(exs, 4, tiny_lm.mask_token_id, 3, offsets=[[1], [0], [2]])
    Lc = batch.clean_len
    with torch.no_grad():
        one = forward_batch(model, batch)
        two = gated_forward(model, batch, model.disable_adapter())
        with model.disable_adapter():
            bare = forward_batch(model, batch)
    keep = batch.noisy_labels != -100
    assert torch.allclose(one[:, Lc:][keep], two[keep], atol=1e-9)
    assert torch.allclose(one[:, :Lc], bare[:, :Lc], atol=1e-12)  # the clean copy is the bare model
    assert (one[:, Lc:][keep] - bare[:, Lc:][keep]).abs().max() > 1e-3
    # only the noisy forward is differentiated, and it reaches the adapter
    two = gated_forward(model, batch, model.disable_adapter())
    two[keep].logsumexp(-1).sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mars", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def test_train_gated_writes_a_gated_adapter_and_refuses_to_mix(tiny_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    rows = [{"messages": [{"role": "user", "content": "add 2 + 3"},
                          {"role": "assistant", "content": "2 + 3 = 5 . so the number is 5 ."}]}] * 6
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train", "--data", str(data), "--model", str(tiny_dir), "--max-steps", "2", "--batch-size", "2",
            "--grad-accum", "1", "--lr", "5e-2", "--lora-r", "4", "--lora-alpha", "8", "--warmup-ratio", "0"]
    run = run_cli(*args, "--out", str(tmp_path / "g"), "--gated")
    assert run.returncode == 0, run.stderr
    meta = json.loads((tmp_path / "g" / "mars.json").read_text())
    assert meta["gated"] is True and meta["recipe"]["gated"] is True
    log = [json.loads(x) for x in (tmp_path / "g" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and all("noisy" in r and "clean" not in r for r in log)
    lm = load(str(tiny_dir), adapter=str(tmp_path / "g"))
    assert lm.gated
    mixed = run_cli(*args, "--out", str(tmp_path / "m"), "--adapter", str(tmp_path / "g"))
    assert mixed.returncode != 0 and "gated" in mixed.stderr and "Traceback" not in mixed.stderr
    both = run_cli(*args, "--out", str(tmp_path / "x"), "--gated", "--distill", "0.5")
    assert both.returncode != 0 and "--gated" in both.stderr


def test_a_gated_adapter_that_does_not_fit_is_refused_with_a_message(tiny_dir, gated_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(gated_dir, bad)
    w = load_file(bad / "adapter_model.safetensors")
    key = next(k for k in w if k.endswith("q_proj.lora_A.weight"))
    w[key] = torch.zeros(w[key].shape[0], w[key].shape[1] + 3, dtype=w[key].dtype)
    save_file(w, bad / "adapter_model.safetensors")
    with pytest.raises(AdapterError, match="do not fit"):
        load(str(tiny_dir), adapter=str(bad))


def test_the_app_says_the_adapter_is_gated(pair):
    import app as app_module

    bare, gated = pair
    _, table, *_ = app_module.create_demo(lambda: gated).mars_app.model_info()
    assert "gated: acts at mask positions only" in table and "adapter" in table
    _, table, *_ = app_module.create_demo(lambda: bare).mars_app.model_info()
    assert "gated" not in table


def test_pass_cost_times_the_bare_and_the_gated_model_side_by_side(pair, load_script):
    pc = load_script("pass_cost")
    bare, gated = pair
    res = pc.measure({"": bare.model, "+adapter (gated)": gated.model}, ["fast", "hf"], [1, 3], rounds=1,
                     prompt_len=8, mask_id=gated.mask_token_id)
    assert set(res["median"]) == {"fast", "hf", "fast+adapter (gated)", "hf+adapter (gated)"}
    assert all(ms > 0 for row in res["median"].values() for ms in row.values())
    table = pc.format_table(res["median"], [1, 3])
    assert "with the adapter / bare" in table and "hf+adapter (gated)" in table


def test_float32_fast_path_adds_the_gated_delta_to_its_packed_matrices_as_transformers_does(tiny_dir, gated_dir):
    """float32 is where the fast path runs oneDNN-packed copies of its fused matrices (q|k|v, gate|up) for
    passes of more than two rows, a MARS pass's case; the float64 tests above never reach that code."""
    from mars.runtime.fastpath import FastLM

    gated = load(str(tiny_dir), adapter=str(gated_dir), dtype="float32")
    fast = FastLM(gated.model)
    lin = fast.layers[0].qkv
    assert lin.packed is not None and lin.lora is not None
    a, b = lin.lora
    w = torch.cat([gated.model.get_submodule(f"model.layers.0.self_attn.{n}_proj").weight for n in "qkv"])
    x = torch.randn(1, 5, w.shape[1])
    gate = torch.tensor([0.0, 1, 1, 0, 1]).view(1, 5, 1)
    want = x @ w.T
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)  # no gate: the bare matrices
    torch.testing.assert_close(lin(x, gate), want + gate * ((x @ a.T) @ b.T), rtol=1e-5, atol=1e-5)

    ids = [encode_prompt(gated.tokenizer, p) for p in PROMPTS]
    runs = {bk: generate_ids(gated, ids, DecodeConfig(mode="mars", tau=0.5, block_size=4, max_new_tokens=16,
                                                      backend=bk)) for bk in ("hf", "fast")}
    for h, f in zip(runs["hf"], runs["fast"]):
        assert h.token_ids == f.token_ids
        assert [len(s.token_ids) for s in h.steps] == [len(s.token_ids) for s in f.steps]


def test_a_kept_run_stores_half_the_bytes_loads_back_and_continues(tiny_dir, tmp_path, load_script):
    """tools/keep_run.py: a long run is trained in pieces across sessions and runs/ does not survive a
    stop, so the adapter is committed in float16; the loader and the trainer read it back into float32."""
    data = tmp_path / "d.jsonl"
    rows = [{"messages": [{"role": "user", "content": "add 2 + 3"},
                          {"role": "assistant", "content": "2 + 3 = 5 . so the number is 5 ."}]}] * 6
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train", "--data", str(data), "--model", str(tiny_dir), "--max-steps", "2", "--batch-size", "2",
            "--grad-accum", "1", "--lr", "5e-2", "--lora-r", "4", "--lora-alpha", "8", "--warmup-ratio", "0",
            "--gated"]
    assert run_cli(*args, "--out", str(tmp_path / "g")).returncode == 0
    keep = load_script("keep_run")
    res = keep.keep(tmp_path / "g", tmp_path / "kept", note="a test")
    src, kept = tmp_path / "g" / keep.WEIGHTS, tmp_path / "kept" / keep.WEIGHTS
    assert kept.stat().st_size < 0.6 * src.stat().st_size and 0 < res["max_relative_rounding"] < 1e-3
    meta = json.loads((tmp_path / "kept" / "mars.json").read_text())
    assert meta["gated"] is True and meta["kept"]["note"] == "a test" and (tmp_path / "kept" / "log.jsonl").is_file()

    a = load(str(tiny_dir), adapter=str(tmp_path / "g"), dtype="float32")
    b = load(str(tiny_dir), adapter=str(tmp_path / "kept"), dtype="float32")
    assert b.gated and all(x.dtype == torch.float32 for d in b.model._mars_gated.deltas.values() for x in d)
    ids = torch.tensor([encode_prompt(a.tokenizer, PROMPTS[0]) + [a.mask_token_id] * 3])
    la, lb = a.model(ids).logits, b.model(ids).logits
    assert not torch.equal(la, lb) and torch.allclose(la, lb, atol=1e-3)  # rounded, and only rounded

    more = run_cli(*args, "--out", str(tmp_path / "next"), "--adapter", str(tmp_path / "kept"))
    assert more.returncode == 0, more.stderr
    nxt = json.loads((tmp_path / "next" / "mars.json").read_text())
    assert nxt["total"]["steps"] == 4 and len(nxt["history"]) == 1
    from safetensors.torch import load_file

    assert all(w.dtype == torch.float32 for w in load_file(tmp_path / "next" / keep.WEIGHTS).values())
    with pytest.raises(SystemExit, match="no finished adapter"):
        keep.keep(tmp_path / "missing", tmp_path / "k2")
