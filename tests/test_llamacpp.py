"""The bench's llama.cpp peer (mars.evaluation.llamacpp): skipped with one line where llama-cpp-python is absent or
the model is not the default; where it is installed, it reads the same prompt ids as ours and decodes greedily."""

from __future__ import annotations

import sys
import types

import pytest

from mars.evaluation.bench import BenchConfig, Run, format_table, peer_lines, run_bench
from mars.evaluation.llamacpp import MISSING

PROMPTS = ["tell me a word", "add 2 + 3", "name a colour"]


def _hide_llama_cpp(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError


def test_bench_skips_llamacpp_with_one_line_where_the_package_is_absent(tiny_lm, monkeypatch, capsys):
    _hide_llama_cpp(monkeypatch)
    status = {}
    runs = run_bench(tiny_lm, BenchConfig(PROMPTS, methods=("ar", "llamacpp"), max_new_tokens=4), status=status)
    assert [r.method for r in runs] == ["ar"]  # the others run on
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "llamacpp" in line] == [MISSING]
    assert "docs/peers.md" in MISSING and "not installed" in MISSING
    assert status["skipped"] == {"llamacpp": MISSING} and not status["failed"]


def test_llamacpp_is_skipped_for_a_model_that_is_not_the_default(tiny_lm, monkeypatch, capsys):
    """With the package there (a stand-in module here), a model other than the default has no GGUF to share."""
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    status = {}
    runs = run_bench(tiny_lm, BenchConfig(PROMPTS[:1], methods=("ar", "llamacpp"), max_new_tokens=4), status=status)
    assert [r.method for r in runs] == ["ar"]
    lines = [line for line in capsys.readouterr().err.splitlines() if "llamacpp" in line]
    assert len(lines) == 1 and "default model's GGUF only" in lines[0] and tiny_lm.name in lines[0]


def test_cli_lists_llamacpp_and_the_ar_variants_are_not_run_on_it():
    from mars.evaluation.bench import METHODS, _plan

    assert "llamacpp" in METHODS
    plan = _plan(BenchConfig(PROMPTS, methods=("ar", "llamacpp"), also_backends=("fast-int8",)))
    assert plan == [("ar", None), ("llamacpp", None), ("ar@fast-int8", None)]  # never "llamacpp@fast-int8"


def _run(method, tokens, wall, bs=1):
    return Run(method, None, bs, 2, tokens, tokens, 1.0, wall, tokens / wall)


def test_peer_lines_put_llamacpp_beside_every_core_ar_run():
    runs = [_run("ar", 100, 1.0), _run("llamacpp", 96, 2.0), _run("ar@fast-int8", 100, 0.5),
            _run("ar", 400, 1.0, bs=4)]
    lines = peer_lines(runs, "fast")
    assert lines == [
        "llamacpp 48.0 tokens/s, core AR on fast 100.0 tokens/s at batch 1: core AR 2.08x llama.cpp's tokens/s",
        "llamacpp 48.0 tokens/s, core AR on fast-int8 200.0 tokens/s at batch 1: core AR 4.17x llama.cpp's tokens/s",
    ]
    assert peer_lines([_run("ar", 100, 1.0)]) == []


# ------------------------------------------------------------------ where llama-cpp-python is installed
def _require_llama_cpp():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is an optional install (docs/peers.md)")


@pytest.fixture(scope="module")
def peer_and_lm():
    _require_llama_cpp()
    import torch

    from mars.evaluation.llamacpp import LlamaCppPeer
    from mars.models.loading import load

    lm = load(adapter="none")
    return LlamaCppPeer(torch.get_num_threads(), 512, lm.eos_token_ids), lm


def test_llamacpp_reads_the_same_prompt_ids_as_ours(peer_and_lm):
    """llama-cpp-python's own chat template on the GGUF gives the very ids our tokenizer's template gives."""
    from mars.decoding.decoder import encode_prompt
    from mars.evaluation.bench import read_prompts

    peer, lm = peer_and_lm
    prompts = read_prompts("data/prompts/heldout.jsonl")[:6] + ["Ünïcode ✓ and\nnew lines", "  spaces  "]
    for p in prompts:
        assert peer.template_ids(p) == encode_prompt(lm.tokenizer, p), p


def test_llamacpp_decodes_greedily(peer_and_lm):
    """Deterministic, within max new tokens, and greedy: each token is the argmax of llama.cpp's own logits for the
    text before it (the slow obvious path: the whole text evaluated at once with every position's logits). Its
    text need not be the core's: llama.cpp multiplies the Q4_1 weights with 8-bit activations, and on this 135M
    model that can flip a close first choice ("L'Étoile" against "The capital" below, the two likeliest)."""
    import numpy as np
    from llama_cpp import Llama

    from mars.decoding.decoder import encode_prompt

    peer, lm = peer_and_lm
    ids = encode_prompt(lm.tokenizer, "What is the capital of France?")
    out = peer.generate(ids, 12)
    assert 0 < len(out) <= 12 and peer.generate(ids, 12) == out
    assert len(peer.generate(ids, 3)) == 3 and peer.generate(ids, 3) == out[:3]
    slow = Llama(model_path=str(peer.path), n_threads=peer.threads, n_ctx=512, logits_all=True, verbose=False)
    slow.eval(ids + out)
    scores = np.asarray(slow.scores[len(ids) - 1: len(ids) + len(out) - 1])
    assert [int(i) for i in scores.argmax(axis=1)] == out


def test_bench_runs_llamacpp_beside_core_ar(peer_and_lm):
    peer, lm = peer_and_lm
    status = {}
    runs = run_bench(lm, BenchConfig(PROMPTS[:2], methods=("ar", "llamacpp"), max_new_tokens=8, backend="fast"),
                     status=status)
    assert [r.method for r in runs] == ["ar", "llamacpp"], format_table(runs)
    peer_run = runs[1]
    assert peer_run.prompts == 2 and 0 < peer_run.new_tokens <= 16 and peer_run.tokens_per_s > 0
    assert status["llamacpp"]["template_same_ids"] == 2 and not status["skipped"]
    assert len(peer_lines(runs, "fast")) == 1


def test_a_peer_that_cannot_open_its_file_costs_its_own_row_only(tiny_lm, monkeypatch, capsys):
    """The package there and the model the default (stand-ins here), but the GGUF will not open: the bench says so
    once, as a failed method, and AR runs on."""
    from mars.evaluation import llamacpp

    monkeypatch.setattr(llamacpp, "skip_reason", lambda lm: None)

    class Broken:
        def __init__(self, *a, **k):
            raise ValueError("Failed to load model from file")

    monkeypatch.setattr(llamacpp, "LlamaCppPeer", Broken)
    status = {}
    runs = run_bench(tiny_lm, BenchConfig(PROMPTS[:1], methods=("ar", "llamacpp"), max_new_tokens=4), status=status)
    assert [r.method for r in runs] == ["ar"]
    assert "Failed to load model" in status["failed"]["llamacpp"]
    assert "error: method llamacpp failed" in capsys.readouterr().err
