"""Evaluation and benchmark harness: their numbers checked against cases whose answers are known."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mars.evaluation.bench import BenchConfig, _plan, format_table, read_prompts, run_bench
from mars.evaluation.evaluate import draft_accuracy
from mars.training.objective import Example
from mars.evaluation.quality import prefix_match

ROOT = Path(__file__).resolve().parent.parent


class Oracle(torch.nn.Module):
    """Predicts, at every position t, the true token t+1 (the clean sequence is known) at distances
    up to `reach` from the last real token, and a wrong token beyond it."""

    def __init__(self, seq, vocab, reach, mask_id):
        super().__init__()
        self.seq, self.V, self.reach, self.mask_id = seq, vocab, reach, mask_id
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, position_ids, attention_mask=None, **_):
        b, n = input_ids.shape
        logits = torch.zeros(b, n, self.V)
        for i in range(n):
            t = int(position_ids[0, i])
            target = self.seq[t + 1] if t + 1 < len(self.seq) else 0
            # distance from the last real token: 1 for a real input, o + 2 for the mask at block offset o
            d = (t % 4) + 2 if int(input_ids[0, i]) == self.mask_id else 1
            logits[0, i, target if d <= self.reach else (target + 1) % self.V] = 10.0
        return type("Out", (), {"logits": logits})()


class FakeLM:
    def __init__(self, model, mask_id):
        self.model, self.mask_token_id = model, mask_id
        self.eos_token_ids = [2]


def test_draft_accuracy_counts_distances_and_chains():
    prompt, resp = [5, 6, 7, 8, 9], list(range(20, 36)) + [2]
    seq = prompt + resp + [2] * 8
    for reach, acc, chain in ((4, {2: 1.0, 3: 1.0, 4: 1.0}, 4.0), (2, {2: 1.0, 3: 0.0, 4: 0.0}, 2.0)):
        lm = FakeLM(Oracle(seq, 64, reach, mask_id=3), 3)
        res = draft_accuracy(lm, [Example(prompt, resp)], block_size=4)
        assert {d: round(a, 6) for d, a in res.accuracy_by_distance.items()} == acc
        assert res.est_tokens_per_pass == chain
        assert sum(c["count"] for c in res.calibration) == sum(res.count_by_distance.values())


def test_prefix_match():
    assert prefix_match([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert prefix_match([1, 2], [1, 2, 3]) == 1.0
    assert prefix_match([], [5]) == 1.0


def test_bench_runs_all_methods_side_by_side(tiny_lm, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("what is the capital of france ?\n{\"prompt\": \"tell me a word\"}\n\nadd 2 + 3\n")
    prompts = read_prompts(f)
    assert prompts == ["what is the capital of france ?", "tell me a word", "add 2 + 3"]
    cfg = BenchConfig(prompts, methods=("hf", "ar", "mars", "lookup", "verified", "verified_lookup", "verified_both",
                                        "jacobi"), taus=(1.0, 0.0), batch_sizes=(1, 2), max_new_tokens=12)
    runs = run_bench(tiny_lm, cfg)
    keys = [(r.method, r.tau, r.batch_size) for r in runs]
    assert ("lookup", None, 1) in keys and ("lookup", None, 2) not in keys
    for r in runs:
        if r.method in ("ar", "hf", "lookup", "verified", "verified_lookup", "verified_both", "jacobi") or (
                r.method == "mars" and r.tau == 1.0):
            assert r.exact_match_with_ar == 1.0, r  # all greedy-exact methods agree with AR
        if r.method == "ar":
            assert r.speedup_vs_ar == 1.0 and r.tokens_per_pass == 1.0
    fast = [r for r in runs if r.method == "mars" and r.tau == 0.0]
    assert all(r.tokens_per_pass > 1.0 for r in fast)
    assert "mars" in format_table(runs)


def test_bench_also_backends_run_each_core_method_on_each_backend(tiny_lm):
    """int8 beside float32 in one run: every core method again as method@backend, against the one AR."""
    cfg = BenchConfig(["what is the capital of france ?", "add 2 + 3"], methods=("hf", "ar", "mars"), taus=(1.0,),
                      max_new_tokens=8, backend="fast", also_backends=("hf", "fast-int8"))
    runs = {r.method: r for r in run_bench(tiny_lm, cfg)}
    assert set(runs) == {"ar", "hf", "mars", "ar@hf", "mars@hf", "ar@fast-int8", "mars@fast-int8"}
    # the transformers backend is the same float model: same greedy text; int8 is its own model, its AR and its
    # tau 1.0 agree with each other whatever they do against float32
    assert runs["ar@hf"].exact_match_with_ar == runs["mars@hf"].exact_match_with_ar == 1.0
    assert runs["ar@fast-int8"].outputs == runs["mars@fast-int8"].outputs
    mixed = BenchConfig(["x"], methods=("ar", "verified_tree", "verified_tree_last:3"), tree_nodes=(2, 5))
    assert [m for m, _ in _plan(mixed)] == ["ar", "verified_tree:2", "verified_tree:5", "verified_tree_last:3"]
    with pytest.raises(ValueError, match="unknown methods"):
        BenchConfig(["x"], methods=("verified_tree:x",))


def test_bench_tree_with_the_datastore_keeps_ar_text(tiny_lm, monkeypatch):
    """verified_tree_store: the tree with datastore chains (here a table of the tiny model's own answers); lossless."""
    from mars.decoding.datastore import Datastore
    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids

    prompts = ["what is the capital of france ?", "add 2 + 3"]
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in prompts]
    own = [p + generate_ids(tiny_lm, [p], DecodeConfig(mode="ar", max_new_tokens=12))[0].token_ids for p in ids]
    monkeypatch.setattr(tiny_lm, "datastore", Datastore.from_sequences(own, min_count=1), raising=False)
    cfg = BenchConfig(prompts, methods=("ar", "verified_tree_store:4", "verified_tree_last:4"), max_new_tokens=12,
                      backend="fast")
    runs = {r.method: r for r in run_bench(tiny_lm, cfg)}
    assert runs["verified_tree_store:4"].exact_match_with_ar == runs["verified_tree_last:4"].exact_match_with_ar == 1.0
    assert runs["verified_tree_store:4"].passes < runs["verified_tree_last:4"].passes
    with pytest.raises(ValueError, match="unknown backends"):
        BenchConfig(["x"], also_backends=("fast-int4",))


def test_bench_interrupted_keeps_whole_batches(tiny_lm):
    """Ctrl-C mid-run: the batches every method finished are counted, side by side, and the status says so."""
    cfg = BenchConfig(["tell me a word", "add 2 + 3", "name a colour"], methods=("ar", "mars"), taus=(0.5,),
                      batch_sizes=(1, 2), max_new_tokens=6)
    calls = []

    def progress(method, tau, bs):  # plan per batch: ar, mars@0.5; interrupt in the 2nd batch's mars run
        calls.append((method, tau, bs))
        if len(calls) == 4:
            raise KeyboardInterrupt

    status = {}
    runs = run_bench(tiny_lm, cfg, progress=progress, status=status)
    assert status == {"interrupted": True, "finished": {1: 1}, "total": 3, "failed": {}, "skipped": {}}
    assert [(r.method, r.batch_size, r.prompts) for r in runs] == [("ar", 1, 1), ("mars", 1, 1)]
    assert all(r.interrupted and len(r.row_passes) == 1 for r in runs)
    with pytest.raises(KeyboardInterrupt):  # nothing finished: nothing to report
        run_bench(tiny_lm, cfg, progress=lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))


def test_bench_drops_a_method_that_raises_and_keeps_the_others(tiny_lm, capsys):
    """One broken method (on a GPU: a graph capture, say) costs its own row only, whether it fails in the
    warm-up or in a later batch; the others stay side by side and AR, the baseline, is never dropped. The
    failures come from the backend the bench hands the decoder (run_bench's `runner`)."""
    from mars.decoding.decoder import make_runner

    seen = {"verified": 0}

    def flaky(model, dcfg, batch, capacity):
        if dcfg.mode == "mars" and dcfg.tau == 0.5:
            raise RuntimeError("graph capture failed")
        if dcfg.mode == "verified":
            seen["verified"] += 1
            if seen["verified"] == 3:  # warm-up, batch 1, then fails on batch 2
                raise RuntimeError("late failure")
        return make_runner(model, dcfg, batch, capacity)

    cfg = BenchConfig(["tell me a word", "add 2 + 3", "name a colour"], methods=("ar", "mars", "verified_both"),
                      taus=(1.0, 0.5), max_new_tokens=6)
    status = {}
    runs = run_bench(tiny_lm, cfg, status=status, runner=flaky)
    assert [(r.method, r.tau, r.prompts) for r in runs] == [("ar", None, 3), ("mars", 1.0, 3)]
    assert runs[1].exact_match_with_ar == 1.0 and len(runs[1].row_passes) == 3
    assert set(status["failed"]) == {"mars tau 0.5", "verified_both tau 0.0"}
    assert "graph capture failed" in status["failed"]["mars tau 0.5"]
    assert "error: method mars tau 0.5 failed" in capsys.readouterr().err

    def broken_ar(model, dcfg, batch, capacity):
        if dcfg.mode == "ar":
            raise RuntimeError("no baseline")
        return make_runner(model, dcfg, batch, capacity)

    with pytest.raises(RuntimeError, match="no baseline"):
        run_bench(tiny_lm, cfg, runner=broken_ar)


def test_compare_rows_counts_wins_per_kind():
    from mars.evaluation.bench import Run, compare_rows, format_compare

    def run(method, tau, tpf):  # one token per forward scaled: rows of 12 tokens
        outs = [[0] * 12 for _ in tpf]
        return Run(method, tau, 1, len(tpf), 12 * len(tpf), 0, 1.0, 1.0, 1.0, outputs=outs,
                   row_passes=[round(12 / x) for x in tpf])

    runs = [run("mars", 0.9, [1.5, 1.0, 1.2, 2.0]), run("lookup", None, [1.0, 1.0, 2.0, 3.0])]
    rows = compare_rows(runs, ("mars", 0.9), ("lookup", None), ["facts", "facts", "rewrite", "rewrite"])
    assert [(r["kind"], r["a_wins"], r["b_wins"], r["ties"]) for r in rows] == [("facts", 1, 0, 1), ("rewrite", 0, 2, 0)]
    assert rows[0]["a_tokens_per_pass"] == pytest.approx(1.25) and rows[1]["b_tokens_per_pass"] == pytest.approx(2.5)
    assert compare_rows(runs, ("mars", 0.9), ("lookup", None))[0]["prompts"] == 4  # no kinds: one row
    assert compare_rows(runs, ("mars", 0.5), ("lookup", None)) == []
    assert "rewrite" in format_compare(rows, "mars", "lookup")


def test_narrow_pass_warning_when_ar_costs_more_per_pass_than_mars_tau_1():
    from mars.evaluation.bench import Run, ms_per_pass, narrow_pass_warnings

    def run(method, tau, passes, wall_s, batch=1):
        return Run(method, tau, batch, 4, 48, passes, 48 / passes, wall_s, 48 / wall_s)

    # AR: 48 passes in 1.8 s = 37.5 ms a pass; MARS tau 1.0: 24 passes in 0.6 s = 25 ms a pass
    slow_ar = [run("ar", None, 48, 1.8), run("mars", 1.0, 24, 0.6), run("mars", 0.9, 12, 0.2)]
    assert ms_per_pass(slow_ar[0]) == pytest.approx(37.5)
    (line,) = narrow_pass_warnings(slow_ar)
    assert line.startswith("warning:") and "37.5 ms" in line and "25.0 ms" in line and "1.50x" in line
    assert "batch 1" in line and " on " not in line
    # AR at most MARS tau 1.0's cost a pass (equal included): quiet; tau 0.9 alone is never the reference
    assert narrow_pass_warnings([run("ar", None, 48, 1.2), run("mars", 1.0, 24, 0.6)]) == []
    assert narrow_pass_warnings([run("ar", None, 48, 1.8), run("mars", 0.9, 12, 0.2)]) == []
    assert narrow_pass_warnings([run("ar", None, 48, 1.8)]) == []
    # each backend against its own MARS, each batch size against its own
    runs = [run("ar", None, 48, 1.2), run("mars", 1.0, 24, 0.6), run("ar@fast-int8", None, 48, 1.8),
            run("mars@fast-int8", 1.0, 24, 0.6), run("ar", None, 48, 1.8, batch=2), run("mars", 1.0, 24, 0.3)]
    (line,) = narrow_pass_warnings(runs)
    assert "on fast-int8 at batch 1" in line


def test_by_kind_reports_each_kind_against_ar():
    from mars.evaluation.bench import Run, by_kind, format_by_kind

    def run(method, tau, forwards, seconds):  # 4 prompts of 12 tokens each, at batch 1
        return Run(method, tau, 1, 4, 48, sum(forwards), 1.0, sum(seconds), 1.0, outputs=[[0] * 12] * 4,
                   row_passes=forwards, batch_seconds=seconds)

    runs = [run("ar", None, [12] * 4, [1.0, 1.0, 2.0, 2.0]),
            run("verified_both", 0.0, [6, 12, 4, 4], [0.5, 1.5, 1.0, 1.0])]
    rows = by_kind(runs, ["facts", "facts", "rewrite", "rewrite"])
    got = {(r["kind"], r["method"]): (round(r["tokens_per_pass"], 3), round(r["vs_ar"], 3)) for r in rows}
    assert got == {("facts", "ar"): (1.0, 1.0), ("rewrite", "ar"): (1.0, 1.0),
                   ("facts", "verified_both"): (1.333, 1.0), ("rewrite", "verified_both"): (3.0, 2.0)}
    text = format_by_kind(rows)
    assert "rewrite" in text and "verified_both" in text and "2.00x" in text


def test_spread_indices():
    from mars.evaluation.bench import spread_indices

    assert spread_indices(150, 10) == list(range(0, 150, 15))  # one per kind of a 10-kind file
    assert spread_indices(3, 5) == [0, 1, 2] and spread_indices(4, None) == [0, 1, 2, 3]
    assert spread_indices(7, 3) == [0, 2, 4]


def test_read_prompts_with_kinds(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "kind": "facts"}\nplain line\n')
    assert read_prompts(f, with_kinds=True) == (["a", "plain line"], ["facts", None])


def test_cli_bench_and_eval_write_json(tiny_dir, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("tell me a word\nadd 2 + 3\n")
    out = tmp_path / "not-yet" / "b.json"  # the folder is made before the run, not found missing after it
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "mars", "bench", "--prompts", str(f), "--model", str(tiny_dir),
                        "--methods", "hf,ar,mars,lookup", "--taus", "0.5", "--max-new-tokens", "8", "--out", str(out),
                        "--backend", "hf"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert {"model", "block_size", "machine", "runs"} <= set(data) and data["backend"] == "hf"
    need = {"method", "tau", "batch_size", "prompts", "new_tokens", "passes", "tokens_per_pass", "wall_s",
            "tokens_per_s", "speedup_vs_ar", "exact_match_with_ar", "prefix_match_with_ar", "mean_nll_under_ar",
            "peak_rss_mb"}
    assert all(need <= set(run) for run in data["runs"])
    assert all(len(run["row_passes"]) == len(run["row_new_tokens"]) == 2 for run in data["runs"])
    assert "lookup wins" in r.stdout  # where prompt lookup wins and loses against MARS


def test_out_that_cannot_be_written_fails_before_the_run(tmp_path):
    from mars.cli import _prepare_out

    with pytest.raises(SystemExit, match="cannot write"):
        _prepare_out(str(tmp_path))  # a folder, not a file
    _prepare_out(str(tmp_path / "a" / "b" / "r.json"))
    assert (tmp_path / "a" / "b").is_dir()


def test_report_plots_are_written(tmp_path):
    from mars.evaluation.plots import bench_png, calibration_png, curve_png, loss_png, pareto_png

    data = {"model": "m", "adapter": None, "runs": [
        {"method": "mars", "tau": t, "batch_size": bs, "tokens_per_pass": 1 + (1 - t), "speedup_vs_ar": 1 + (1 - t) / 2}
        for t in (1.0, 0.9, 0.5) for bs in (1, 4)] + [
        {"method": "jacobi", "tau": None, "batch_size": 1, "tokens_per_pass": 1.02, "speedup_vs_ar": 0.8}]}
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"seconds": 60 * i, "noisy": 5 - i / 10, "clean": 1 - i / 100}) + "\n"
                           for i in range(10)))
    report = {"decoding": [{"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.5},
                           {"tau": 0.5, "tokens_per_pass": 1.4, "mean_nll_under_ar": 0.7}],
              "draft_accuracy": {"calibration": [{"confidence": 0.2, "accuracy": 0.1, "count": 5},
                                                 {"confidence": 0.9, "accuracy": 0.8, "count": 2}]}}
    points = [{"cpu_hours": h, "est_tokens_per_pass": 1 + h / 10, "accuracy_by_distance": {"2": h / 10, "3": h / 20},
               "tokens_per_pass": {"0.9": 1 + h / 50} if h > 1 else {}} for h in (0.5, 1.5, 3.0)]
    for p in (curve_png(points, tmp_path / "c.png"), loss_png([log, log], tmp_path / "l2.png")):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    # points with decoding quality get a third panel (NLL ratio against the own AR text)
    from PIL import Image

    for p in points[1:]:
        p["quality"] = {"1": {"mean_nll_under_ar": 0.3}, "0.9": {"mean_nll_under_ar": 0.3 + p["cpu_hours"] / 20}}
    wide = curve_png(points, tmp_path / "cq.png")
    assert Image.open(wide).width > 1.3 * Image.open(tmp_path / "c.png").width
    for p in (bench_png(data, tmp_path / "b.png"), loss_png(log, tmp_path / "l.png"),
              pareto_png({"x": report}, tmp_path / "p.png"), calibration_png(report, tmp_path / "c.png")):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_decoding_eval_rows_and_drift_control(tiny_lm):
    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
    from mars.evaluation.evaluate import decoding_eval

    import tiny

    other = tiny.make_loaded("llama", seed=3)  # a different model on the same tokenizer: the "bare" control
    prompts = [encode_prompt(tiny_lm.tokenizer, p) for p in ("tell me a word", "add 2 + 3", "name a colour")]
    ar = generate_ids(tiny_lm, prompts, DecodeConfig(mode="ar", max_new_tokens=8))
    answers = [tiny_lm.tokenizer.decode(r.token_ids[:2]) for r in ar]  # known answers the model gets at tau 1
    rows = decoding_eval(tiny_lm, other, prompts, [0.0], 4, 8, known=(prompts, answers))
    one, zero = rows
    assert one["tau"] == 1.0 and one["tokens_per_pass"] == 1.0 and one["exact_match_with_tau1"] == 1.0
    assert one["histogram"] == {1: one["tokens"]} and one["known_answer_accuracy"] == 1.0
    assert zero["tokens_per_pass"] > 1.0 and sum(k * v for k, v in zero["histogram"].items()) == zero["tokens"]
    bare_ar = generate_ids(other, prompts, DecodeConfig(mode="ar", max_new_tokens=8))
    want = sum(prefix_match(b.token_ids, a.token_ids) for a, b in zip(ar, bare_ar)) / 3
    assert one["prefix_match_with_bare"] == pytest.approx(want) and want < 1.0
    same = decoding_eval(tiny_lm, tiny_lm, prompts, [1.0], 4, 8)  # bare is the model itself: no drift to measure
    assert same[0]["exact_match_with_bare"] is None
    assert same[0]["mean_nll_under_ar"] == pytest.approx(same[0]["mean_nll_under_bare"])


def test_cli_eval_writes_report(tiny_dir, tmp_path):
    data = tmp_path / "held.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in (("tell me a word", "water is a good word ."), ("add 2 + 3", "2 + 3 = 5 . so it is 5 ."))]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    known = tmp_path / "known.jsonl"
    known.write_text(json.dumps({"prompt": "add 2 + 3", "answer": "5"}) + "\n")
    out = tmp_path / "e.json"
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "mars", "eval", "--model", str(tiny_dir), "--adapter", "none",
                        "--data", str(data), "--taus", "0.9", "0.5", "--max-new-tokens", "6", "--known", str(known),
                        "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["examples"] == 2 and set(rep["draft_accuracy"]["accuracy_by_distance"]) == {"2", "3", "4"}
    assert [row["tau"] for row in rep["decoding"]] == [1.0, 0.9, 0.5]
    assert all("known_answer_accuracy" in row and row["exact_match_with_bare"] is None for row in rep["decoding"])


def test_decoding_eval_reports_stutters_and_the_repeat_guard(tiny_lm):
    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
    from mars.evaluation.evaluate import decoding_eval
    from mars.evaluation.quality import stutter_rate

    prompts = [encode_prompt(tiny_lm.tokenizer, p) for p in ("tell me a word", "add 2 + 3", "name a colour")]
    for rt in (None, 1.0):
        one, zero = decoding_eval(tiny_lm, None, prompts, [0.0], 4, 30, repeat_tau=rt)
        assert one["repeat_tau"] == zero["repeat_tau"] == rt
        assert one["stutter"]["extra_repeats"] == 0 and one["repeat_guard_stops"] == 0  # tau 1.0 is the reference
        runs = generate_ids(tiny_lm, prompts, DecodeConfig(tau=0.0, max_new_tokens=30, repeat_tau=rt))
        ref = generate_ids(tiny_lm, prompts, DecodeConfig(tau=1.0, max_new_tokens=30))
        text = lambda rs: [tiny_lm.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in rs]
        assert zero["stutter"] == stutter_rate(text(runs), text(ref))
        assert (zero["repeat_guard_stops"] > 0) == (rt is not None)
