"""The CLI end to end, and the trainer: checkpoints, resume, adapters the loader takes back, accelerate."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.runtime.cpu import bf16_unsupported_reason
from mars.models.loading import load

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mars", *args], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=timeout)


def hf_greedy(lm, ids, n):
    x = torch.tensor([ids])
    return lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()


def test_cli_generate_json_equals_hf_greedy_on_a_local_random_llama(tiny_dir):
    lm = load(str(tiny_dir))
    prompts = ["what is the capital of france ?", "tell me a word"]
    for extra in (["--tau", "1.0"], ["--mode", "ar"], ["--mode", "verified", "--tau", "0"],
                  ["--mode", "verified", "--tau", "0", "--drafts", "both", "--verify-groups", "last"]):
        out = run_cli("generate", *prompts, "--model", str(tiny_dir), "--json", "--max-new-tokens", "24", *extra)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(lines) == 2
        for p, obj in zip(prompts, lines):
            assert obj["token_ids"] == hf_greedy(lm, encode_prompt(lm.tokenizer, p), 24)
            assert obj["passes"] == len(obj["steps"]) and obj["tokens_per_pass"] == pytest.approx(
                len(obj["token_ids"]) / obj["passes"])
            assert obj["tokens"] == len(obj["token_ids"]) and obj["config"]["max_new_tokens"] == 24
            step = obj["steps"][0]
            assert {"token_ids", "text", "confidences", "rejected_token_ids", "rejected_confidences", "tau",
                    "seconds"} <= set(step)


def test_cli_verified_mode_defaults_to_its_fastest_lossless_setting(tiny_dir):
    """--mode verified without --tau sends every draft (tau 0.0), and MARS mode keeps tau 0.9."""
    for mode, tau in (("verified", 0.0), ("mars", 0.9)):
        out = run_cli("generate", "tell me a word", "--model", str(tiny_dir), "--json", "--max-new-tokens", "8",
                      "--mode", mode)
        assert out.returncode == 0, out.stderr
        obj = json.loads(out.stdout.splitlines()[0])
        assert obj["config"]["tau"] == tau and all(step["tau"] == tau for step in obj["steps"])
        assert mode != "verified" or obj["config"]["verify_groups"] == "last"
    help_text = run_cli("generate", "--help").stdout
    assert "verified" in help_text and "the text is AR's whatever tau" in " ".join(help_text.split())


def test_cli_generate_default_model_tau1_equals_hf_greedy(default_lm):
    prompt = "Name two planets."
    out = run_cli("generate", prompt, "--adapter", "none", "--tau", "1.0", "--json", "--max-new-tokens", "24")
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout.splitlines()[0])
    assert obj["token_ids"] == hf_greedy(default_lm, encode_prompt(default_lm.tokenizer, prompt), 24)


def test_cli_errors_are_one_line_and_non_zero(tmp_path):
    out = run_cli("generate", "hi", "--model", str(tmp_path / "missing"))
    assert out.returncode == 2 and out.stderr.strip().startswith("error:") and "missing" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run_cli("generate", "   ", "--model", str(tmp_path / "missing"))
    assert out.returncode == 2
    out = run_cli("generate", "hi", "--tau", "3", "--adapter", "none")
    assert out.returncode == 2 and "tau" in out.stderr
    out = run_cli("generate", "hi", "--drafts", "lookup", "--adapter", "none")  # copies need the AR check
    assert out.returncode == 2 and "needs mode 'verified'" in out.stderr


def _data(path: Path):
    rows = [
        {"messages": [{"role": "user", "content": "what is the capital of france ?"},
                      {"role": "assistant", "content": "the capital of france is paris . it is a great city ."}]},
        {"messages": [{"role": "user", "content": "add 2 + 3"},
                      {"role": "assistant", "content": "2 + 3 = 5 . so the number is 5 ."}]},
        {"messages": [{"role": "user", "content": "tell me a word"},
                      {"role": "assistant", "content": "water is a good word ."}]},
    ] * 4
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_args(tiny_dir, data, out, steps, *extra):
    return ["train", "--data", str(data), "--out", str(out), "--model", str(tiny_dir), "--max-steps", str(steps),
            "--batch-size", "2", "--grad-accum", "2", "--lr", "5e-3", "--schedule", "constant",
            "--warmup-ratio", "0", "--save-every", "2", "--lora-r", "4", "--lora-alpha", "8", *extra]


def test_train_resume_and_load_back(tiny_dir, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    straight = run_cli(*train_args(tiny_dir, data, tmp_path / "a", 6))
    assert straight.returncode == 0, straight.stderr
    # interrupted after 4 steps (its last checkpoint), then the same command resumes to 6
    first = run_cli(*train_args(tiny_dir, data, tmp_path / "b", 4))
    assert first.returncode == 0, first.stderr
    resumed = run_cli(*train_args(tiny_dir, data, tmp_path / "b", 6))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout + resumed.stderr
    log = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert all("noisy" in r and "clean" in r for r in log)
    from safetensors.torch import load_file

    wa = load_file(tmp_path / "a" / "adapter_model.safetensors")
    wb = load_file(tmp_path / "b" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    meta = json.loads((tmp_path / "a" / "mars.json").read_text())
    assert meta["block_size"] == 4 and meta["mask_token"] == "<|mask|>" and meta["steps"] == 6
    lm = load(str(tiny_dir), adapter=str(tmp_path / "a"))
    assert lm.trained_block_size == 4 and lm.adapter
    bare = load(str(tiny_dir))
    ids = encode_prompt(lm.tokenizer, "add 2 + 3")
    cfg = DecodeConfig(mode="ar", max_new_tokens=8)
    assert generate_ids(lm, [ids], cfg)[0].token_ids != generate_ids(bare, [ids], cfg)[0].token_ids

    # continuing the adapter (training in pieces): the new piece's metadata carries its ancestry and totals
    cont = run_cli(*train_args(tiny_dir, data, tmp_path / "c", 2, "--adapter", str(tmp_path / "a"),
                               "--lora-r", "16"))  # ignored: the adapter is r=4, and mars.json says so
    assert cont.returncode == 0, cont.stderr
    meta_c = json.loads((tmp_path / "c" / "mars.json").read_text())
    assert meta_c["recipe"]["lora_r"] == 4 and meta_c["recipe"]["lora_alpha"] == 8
    assert [h["steps"] for h in meta_c["history"]] == [6] and meta_c["steps"] == 2
    assert meta_c["total"]["steps"] == 8 and meta_c["total"]["sequences"] == meta["sequences"] + meta_c["sequences"]
    assert meta_c["total"]["train_seconds"] == pytest.approx(meta["train_seconds"] + meta_c["train_seconds"], abs=0.2)


def test_history_chains_pieces():
    from mars.training.train import with_history

    def m(steps, secs, procs=1, **extra):
        return {"steps": steps, "sequences": 8 * steps, "train_seconds": secs, "processes": procs,
                "recipe": {"lr": 2e-4, "threads": 1}, **extra}

    b = with_history(m(10, 100.0), m(5, 60.0))
    c = with_history(m(20, 300.0, procs=2), b)
    assert [h["steps"] for h in c["history"]] == [5, 10]
    assert c["total"] == {"steps": 35, "sequences": 280, "train_seconds": 460.0, "cpu_seconds": 760.0}
    # a run that shared its cores records its own CPU time: that, not wall time, is what it cost
    d = with_history(m(10, 300.0, train_cpu_seconds=120.0), c)
    assert d["total"]["cpu_seconds"] == 880.0 and d["total"]["train_seconds"] == 760.0


def test_train_with_distillation_term(tiny_dir, tmp_path):
    """--distill adds KL(bare || model) on the clean copy: zero while the adapter is still the identity
    (LoRA's B starts at zero), positive once it has moved; full fine-tuning has no bare model to ask."""
    data = _data(tmp_path / "d.jsonl")
    out = run_cli(*train_args(tiny_dir, data, tmp_path / "k", 3, "--distill", "0.5"))
    assert out.returncode == 0, out.stderr
    log = [json.loads(x) for x in (tmp_path / "k" / "log.jsonl").read_text().splitlines()]
    assert log[0]["distill"] < 1e-5 and all(r["distill"] > 1e-5 for r in log[1:])
    assert json.loads((tmp_path / "k" / "mars.json").read_text())["recipe"]["distill"] == 0.5
    bad = run_cli(*train_args(tiny_dir, data, tmp_path / "kf", 1, "--distill", "0.5", "--method", "full"))
    assert bad.returncode == 2 and "--distill needs --method lora" in bad.stderr


def test_train_full_finetune_writes_a_loadable_model(tiny_dir, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    out = run_cli(*train_args(tiny_dir, data, tmp_path / "f", 2, "--method", "full"))
    assert out.returncode == 0, out.stderr
    lm = load(str(tmp_path / "f" / "model"))
    assert lm.trained_block_size == 4 and lm.mask_token == "<|mask|>"


@pytest.mark.slow  # ~30-60 s on a quiet 2-core machine: the default run stays under ~15 min
def test_train_runs_under_accelerate_launch_with_two_processes(tiny_dir, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "mars",
           *train_args(tiny_dir, data, tmp_path / "ddp", 3)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    log = [json.loads(x) for x in (tmp_path / "ddp" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]  # written once, by the main process
    assert log[-1]["sequences"] % (2 * 2) == 0  # micro-batches x batch x 2 processes
    assert json.loads((tmp_path / "ddp" / "mars.json").read_text())["processes"] == 2
    assert (tmp_path / "ddp" / "adapter_model.safetensors").is_file()
    lm = load(str(tiny_dir), adapter=str(tmp_path / "ddp"))
    assert lm.adapter


def test_eval_default_data_files_are_in_the_repo():
    """`python -m mars eval` with no --data/--known must find the committed held-out and known-answer sets."""
    from mars.cli import build_parser

    args = build_parser().parse_args(["eval"])
    for path in (args.data, args.known):
        assert (ROOT / path).is_file(), path


@pytest.mark.slow  # ~30-60 s on a quiet 2-core machine: the default run stays under ~15 min
def test_train_with_shifted_grids_two_noisy_copies_and_sequence_weighting(tiny_dir, tmp_path):
    """Issue 13 items 2-3 as options: the run trains, records them, and resumes to the straight run's
    weights (the offsets are a function of seed, epoch and example index, not of how far the run got)."""
    data = _data(tmp_path / "d.jsonl")
    extra = ("--shift-blocks", "--noisy-copies", "2", "--loss-weighting", "sequence", "--block-size", "3")
    straight = run_cli(*train_args(tiny_dir, data, tmp_path / "s", 4, *extra))
    assert straight.returncode == 0, straight.stderr
    first = run_cli(*train_args(tiny_dir, data, tmp_path / "r", 2, *extra))
    assert first.returncode == 0, first.stderr
    resumed = run_cli(*train_args(tiny_dir, data, tmp_path / "r", 4, *extra))
    assert resumed.returncode == 0 and "resuming" in resumed.stdout + resumed.stderr
    from safetensors.torch import load_file

    wa = load_file(tmp_path / "s" / "adapter_model.safetensors")
    wb = load_file(tmp_path / "r" / "adapter_model.safetensors")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    rec = json.loads((tmp_path / "s" / "mars.json").read_text())["recipe"]
    assert rec["shift_blocks"] is True and rec["noisy_copies"] == 2 and rec["loss_weighting"] == "sequence"
    plain = run_cli(*train_args(tiny_dir, data, tmp_path / "p", 1, "--block-size", "3"))
    assert plain.returncode == 0
    log_s = json.loads((tmp_path / "s" / "log.jsonl").read_text().splitlines()[0])
    log_p = json.loads((tmp_path / "p" / "log.jsonl").read_text().splitlines()[0])
    assert log_s["noisy"] != log_p["noisy"]  # same weights at step 1's start, other targets and weighting
    bad = run_cli(*train_args(tiny_dir, data, tmp_path / "x", 1, "--noisy-copies", "5"))
    assert bad.returncode == 2 and "noisy_copies" in bad.stderr


def test_train_stops_on_its_cpu_budget_and_records_it(tiny_dir, tmp_path):
    """--max-cpu-minutes: arms that share cores stop on their own CPU time, not on the wall clock."""
    data = _data(tmp_path / "d.jsonl")
    run = run_cli(*train_args(tiny_dir, data, tmp_path / "c", 50, "--max-cpu-minutes", "0.00001"))
    assert run.returncode == 0, run.stderr
    log = [json.loads(x) for x in (tmp_path / "c" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1]  # the budget is spent within the first step
    meta = json.loads((tmp_path / "c" / "mars.json").read_text())
    assert meta["steps"] == 1 and meta["train_cpu_seconds"] > 0 and meta["recipe"]["max_cpu_minutes"] == 0.00001
    bad = run_cli(*train_args(tiny_dir, data, tmp_path / "z", 5, "--max-cpu-minutes", "0"))
    assert bad.returncode == 2 and "max_cpu_minutes must be > 0" in bad.stderr


def test_snapshot_choice_rule():
    from mars.training.train import better_snapshot

    def row(count, right):
        return {"count": count, "right": right, "precision": right / count if count else None}

    rows = [row(0, 0), row(10, 10), row(40, 35), row(30, 28), row(30, 27), row(31, 28)]
    best, kept = None, []
    for i, r in enumerate(rows):
        if better_snapshot(best, r, 0.9):
            best = r
            kept.append(i)
    assert kept == [1, 3, 5]  # 40 drafts at 87.5% right never qualifies; a tie keeps the earlier one


@pytest.mark.slow  # ~30-60 s on a quiet 2-core machine: the default run stays under ~15 min
def test_train_selects_a_snapshot_by_teacher_forced_precision(tiny_dir, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    sel = ("--select-data", str(data), "--select-limit", "3", "--save-every", "1")
    # threshold 0 and precision 0: every snapshot qualifies with the same count, so the first one is kept
    out = run_cli(*train_args(tiny_dir, data, tmp_path / "s", 3, *sel, "--select-threshold", "0",
                              "--select-precision", "0"))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in (tmp_path / "s" / "snapshots.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["selected"] for r in rows] == [True, False, False]
    assert rows[0]["count"] == rows[1]["count"] > 0 and rows[0]["share"] == 1.0
    meta = json.loads((tmp_path / "s" / "best" / "mars.json").read_text())
    assert meta["selected_by"]["step"] == 1 and meta["steps"] == 1
    one = run_cli(*train_args(tiny_dir, data, tmp_path / "one", 1))
    assert one.returncode == 0, one.stderr
    from safetensors.torch import load_file

    wb = load_file(tmp_path / "s" / "best" / "adapter_model.safetensors")
    w1 = load_file(tmp_path / "one" / "adapter_model.safetensors")
    w3 = load_file(tmp_path / "s" / "adapter_model.safetensors")
    assert all(torch.allclose(wb[k], w1[k], atol=1e-6) for k in w1)  # the step-1 weights were kept
    assert not all(torch.allclose(wb[k], w3[k], atol=1e-6) for k in w3)
    assert load(str(tiny_dir), adapter=str(tmp_path / "s" / "best")).adapter
    # the default rule (0.9 / 0.9): the log's choices replay the rule, and best/ exists iff one qualified
    from mars.training.train import better_snapshot

    strict = run_cli(*train_args(tiny_dir, data, tmp_path / "t", 2, *sel))
    assert strict.returncode == 0, strict.stderr
    rows = [json.loads(x) for x in (tmp_path / "t" / "snapshots.jsonl").read_text().splitlines()]
    best = None
    for r in rows:
        assert r["selected"] == better_snapshot(best, r, 0.9)
        best = r if r["selected"] else best
    assert (tmp_path / "t" / "best").is_dir() == (best is not None)


@pytest.mark.slow  # ~30-60 s on a quiet 2-core machine: the default run stays under ~15 min
def test_train_reads_several_data_files_as_one_set(tiny_dir, tmp_path):
    """--data a b: one epoch covers both files (the fresh-prompt arm trains on template + model-written data)."""
    one, two = _data(tmp_path / "a.jsonl"), _data(tmp_path / "b.jsonl")

    def epoch(out, *files):
        args = [a for a in train_args(tiny_dir, files[0], out, 1) if a not in ("--max-steps", "1")]
        args[args.index("--data") + 1:args.index("--data") + 2] = [str(f) for f in files]
        r = run_cli(*args, "--epochs", "1")
        assert r.returncode == 0, r.stderr
        return json.loads((out / "mars.json").read_text())

    single, both = epoch(tmp_path / "one", one), epoch(tmp_path / "both", one, two)
    assert single["sequences"] == 12 and both["sequences"] == 24  # 12 examples per file
    assert both["data"] == [str(one), str(two)] and single["data"] == str(one)


def test_autocast_is_refused_on_avx2_only_cpus_and_warns_where_bfloat16_is_emulated():
    """Checked with given flag sets, so both answers are tested on any machine (CI may be AVX2 only)."""
    import contextlib

    from mars.training.train import TrainConfig, autocast_context

    assert autocast_context(None, "cpu") is contextlib.nullcontext
    with pytest.raises(ValueError, match="train without --autocast"):
        autocast_context("bfloat16", "cpu", flags={"avx", "avx2", "fma"})
    with pytest.warns(UserWarning, match="emulated"):
        ctx = autocast_context("bfloat16", "cpu", flags={"avx512f", "avx512bw", "avx512vl", "avx512dq"})
    with ctx():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="autocast must be"):
        TrainConfig(data="d", out="o", autocast="float16")


@pytest.mark.skipif(bf16_unsupported_reason() is not None,
                    reason="this CPU has no oneDNN bfloat16 path (the refusal is tested above)")
def test_train_with_bfloat16_autocast_keeps_float32_weights_and_tracks_the_float32_loss(tiny_dir, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    runs = {}
    for name, extra in (("f32", ()), ("bf16", ("--autocast", "bfloat16"))):
        r = run_cli(*train_args(tiny_dir, data, tmp_path / name, 2, "--gated", *extra))
        assert r.returncode == 0, r.stderr
        runs[name] = [json.loads(x)["noisy"] for x in (tmp_path / name / "log.jsonl").read_text().splitlines()]
    first32, first16 = runs["f32"][0], runs["bf16"][0]
    assert first16 != first32  # autocast did act: bfloat16 matmuls round differently
    assert abs(first16 - first32) < 0.05 * first32  # and the loss is the same loss
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "bf16" / "adapter_model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert json.loads((tmp_path / "bf16" / "mars.json").read_text())["recipe"]["autocast"] == "bfloat16"
