"""tools/ship_adapter.py: the model card is written from the numbers on disk, totals summed over pieces."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mars.training.train import with_history

ROOT = Path(__file__).resolve().parent.parent


def _run(folder: Path, steps: int, secs: float, parent: dict | None = None, gated: bool = False) -> dict:
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 1000)
    (folder / "adapter_config.json").write_text("{}")
    meta = {"base_model": "smollm2", "block_size": 4, "mask_token": "<filename>", "method": "lora", "steps": steps,
            "sequences": 8 * steps, "train_seconds": secs, "processes": 1,
            "recipe": {"lr": 2e-4, "threads": 1, "lora_r": 16, "lora_alpha": 32, "lora_targets": ["q_proj"]}}
    meta = with_history(meta, parent) if parent else meta
    if gated:
        meta.update(gated=True, data=["data/selfdistill/train.jsonl.gz", "data/selfdistill/magpie.jsonl.gz"])
    (folder / "mars.json").write_text(json.dumps(meta))
    rows = [{"seconds": 60.0 * i, "noisy": 5 - i / 10, **({} if gated else {"clean": 0.5})} for i in range(1, 6)]
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return meta


def test_ship_writes_card_with_totals_curve_and_refuses_big_weights(tmp_path):
    first = _run(tmp_path / "v0", 100, 3600.0)
    _run(tmp_path / "v1", 50, 1800.0, parent=first)
    ev = {"examples": 3, "block_size": 4,
          "draft_accuracy": {"accuracy_by_distance": {"2": 0.3, "3": 0.2}, "est_tokens_per_pass": 1.4,
                             "calibration": [{"confidence": 0.5, "accuracy": 0.4, "count": 3}]},
          "decoding": [{"tau": 1.0, "tokens_per_forward": 1.0, "mean_nll_under_ar": 0.4},
                       {"tau": 0.9, "tokens_per_forward": 1.123, "mean_nll_under_ar": 0.5}]}
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    curve = [{"name": "v0", "cpu_hours": 1.0, "est_tokens_per_pass": 1.3, "accuracy_by_distance": {"2": 0.28}},
             {"name": "v1", "cpu_hours": 1.5, "est_tokens_per_pass": 1.4, "accuracy_by_distance": {"2": 0.3},
              "tokens_per_forward": {"0.9": 1.123},
              "quality": {"1": {"mean_nll_under_ar": 0.4, "known_answer_accuracy": 0.5},
                          "0.9": {"mean_nll_under_ar": 0.5, "known_answer_accuracy": 0.45}}}]
    (tmp_path / "curve.json").write_text(json.dumps(curve))
    (tmp_path / "limits.md").write_text("- a stated limit\n")
    dest = tmp_path / "out"
    cmd = [sys.executable, "-m", "tools.ship_adapter", "--run", str(tmp_path / "v1"), "--eval", str(tmp_path / "eval.json"),
           "--earlier", str(tmp_path / "v0"), "--curve", str(tmp_path / "curve.json"), "--limits",
           str(tmp_path / "limits.md"), "--dest", str(dest)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    card = (dest / "README.md").read_text()
    assert "150 optimizer steps" in card and "1.50 CPU-hours" in card and "2 resumable" in card
    assert "1.123" in card and "a stated limit" in card
    assert "| v1 | 1.50 | 1.400 | 0.300 | 1.123 | 1.25x | 0.450 |" in card  # tau 0.9's quality cost, by checkpoint
    assert "| v0 | 1.00 | 1.300 | 0.280 | - | - | - |" in card
    assert all((dest / f).stat().st_size > 5000 for f in ("loss.png", "curve.png", "pareto.png", "calibration.png"))
    assert json.loads((dest / "curve.json").read_text()) == curve and len(list((dest / "logs").glob("*.jsonl"))) == 2
    (tmp_path / "v1" / "adapter_model.safetensors").write_bytes(b"\0" * 26_000_000)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "25 MB" in r.stderr


def test_curve_points_merge_decoding_and_refuse_mixed_example_counts(tmp_path, load_script):
    build = load_script("curve").build

    def tf(name, n, est):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"examples": n, "draft_accuracy": {"est_tokens_per_pass": est,
                                                                   "accuracy_by_distance": {"2": est - 1}}}))
        return str(p)

    dec = tmp_path / "dec.json"
    dec.write_text(json.dumps({"decoding": [
        {"tau": 1.0, "tokens_per_forward": 1.0, "mean_nll_under_ar": 0.25, "known_answer_accuracy": 0.3},
        {"tau": 0.9, "tokens_per_forward": 1.05, "mean_nll_under_ar": 0.4, "known_answer_accuracy": 0.2}]}))
    rows = build([("b", tf("b", 100, 1.4), 2.0), ("a", tf("a", 100, 1.3), 1.0)], {"b": str(dec)})
    assert [r["name"] for r in rows] == ["a", "b"]  # by CPU-hours
    assert rows[1]["tokens_per_pass"] == {"0.9": 1.05} and "tokens_per_pass" not in rows[0]  # read from old keys
    q = rows[1]["quality"]  # tau 1.0 kept as the reference the others are judged against
    assert q["1"]["mean_nll_under_ar"] == 0.25 and q["0.9"]["known_answer_accuracy"] == 0.2
    assert q["0.9"]["mean_nll_under_bare"] is None and "quality" not in rows[0]
    with pytest.raises(SystemExit, match="different numbers"):
        build([("a", tf("a", 100, 1.3), 1.0), ("c", tf("c", 40, 1.3), 2.0)], {})
    # a later session keeps the shipped points and adds its own; the example count must still agree
    later = build([("d", tf("d", 100, 1.5), 3.0)], {}, previous=rows)
    assert [r["name"] for r in later] == ["a", "b", "d"] and later[1] == rows[1]
    with pytest.raises(SystemExit, match="different numbers"):
        build([("e", tf("e", 40, 1.5), 3.0)], {}, previous=rows)
    dec20 = tmp_path / "dec20.json"
    dec20.write_text(json.dumps({"examples": 20, **json.loads(dec.read_text())}))
    arm = build([("g", tf("g", 100, 1.2), 0.5)], {"g": str(dec20)}, previous=rows, branches={"g": "gated"})
    g = next(r for r in arm if r["name"] == "g")
    assert g["branch"] == "gated" and g["decoding_examples"] == 20 and "branch" not in arm[-1]


def test_shipped_logs_carry_the_whole_chain_when_shipping_over_the_previous_adapter(tmp_path, load_script):
    ship_logs = load_script("ship_adapter").ship_logs

    first = _run(tmp_path / "v0", 10, 60.0)
    second = _run(tmp_path / "v1", 10, 60.0, parent=first)
    _run(tmp_path / "v2", 10, 60.0, parent=second)
    (tmp_path / "v0" / "log.jsonl").write_text('{"piece": 0}\n')
    (tmp_path / "v2" / "log.jsonl").write_text('{"piece": 2}\n')
    dest = tmp_path / "assets"
    ship_logs([tmp_path / "v0", tmp_path / "v1"], dest / "logs")
    # the next session has only the shipped adapter and its new run; shipping writes over the same folder
    logs = ship_logs([dest, tmp_path / "v2"], dest / "logs")
    assert [p.name for p in logs] == ["00.jsonl", "01.jsonl", "02.jsonl"]
    assert logs[0].read_text() == '{"piece": 0}\n' and logs[2].read_text() == '{"piece": 2}\n'
    assert logs[1].read_text() == (tmp_path / "v1" / "log.jsonl").read_text()


def test_the_shipped_adapter_folder_is_not_git_ignored():
    """ship_adapter writes logs/ and curve.json beside the weights; an ignore rule once swallowed logs/."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for rel in ("assets/mars-adapter/logs/00.jsonl", "assets/mars-adapter/curve.json",
                "assets/mars-adapter/adapter_model.safetensors"):
        r = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT)
        assert r.returncode == 1, f"{rel} is git-ignored"


def test_shipped_recipe_records_the_adapters_real_lora_shape():
    """The card and mars.json are generated from the recipe: it must describe the weights that load."""
    meta = json.loads((ROOT / "assets" / "mars-adapter" / "mars.json").read_text())
    cfg = json.loads((ROOT / "assets" / "mars-adapter" / "adapter_config.json").read_text())
    assert (meta["recipe"]["lora_r"], meta["recipe"]["lora_alpha"]) == (cfg["r"], cfg["lora_alpha"])
    assert sorted(meta["recipe"]["lora_targets"]) == sorted(cfg["target_modules"])
    card = (ROOT / "assets" / "mars-adapter" / "README.md").read_text()
    assert f"lora r={cfg['r']} alpha={cfg['lora_alpha']}" in card


def _eval(rows):
    """An eval.json's decoding rows: (tau, tokens/pass, NLL under AR, NLL under bare, known)."""
    return {"decoding": [{"tau": t, "tokens_per_pass": s, "mean_nll_under_ar": a, "mean_nll_under_bare": b,
                          "known_answer_accuracy": k} for t, s, a, b, k in rows]}


def test_arms_table_ratios_and_curve_dominance(tmp_path, load_script):
    arms = load_script("arms_table")
    ref = arms.points(_eval([(1.0, 1.0, 0.5, 0.6, 0.5), (0.9, 1.2, 0.6, 0.7, 0.5), (0.7, 1.4, 0.8, 0.9, 0.4)]), 0.5)
    assert [p["nll_x_ar"] for p in ref] == pytest.approx([1.0, 1.2, 1.6])
    assert [p["nll_x_bare"] for p in ref] == pytest.approx([1.2, 1.4, 1.8])
    faster = arms.points(_eval([(1.0, 1.0, 0.5, 0.6, 0.5), (0.9, 1.3, 0.6, 0.7, 0.5), (0.7, 1.5, 0.75, 0.9, 0.4)]), 0.5)
    mixed = arms.points(_eval([(1.0, 1.0, 0.5, 0.6, 0.5), (0.9, 1.5, 0.9, 0.7, 0.5), (0.7, 1.6, 1.0, 0.9, 0.4)]), 0.5)
    assert arms.dominates(faster, ref) and not arms.dominates(ref, faster)
    assert not arms.dominates(mixed, ref)  # faster, but no point as good as the reference's at tau 0.9
    assert not arms.dominates(ref, ref)
    # the command: one row per tau per arm, the verdict on each arm's first row
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "eval.json").write_text(json.dumps(_eval([(1.0, 1.0, 0.5, 0.6, 0.5), (0.9, 1.3, 0.6, 0.7, 0.5),
                                                              (0.7, 1.5, 0.75, 0.9, 0.4)])))
    (tmp_path / "a" / "mars.json").write_text(json.dumps({"train_cpu_seconds": 2400, "sequences": 800}))
    (tmp_path / "ref.json").write_text(json.dumps(_eval([(1.0, 1.0, 0.5, 0.6, 0.5), (0.9, 1.2, 0.6, 0.7, 0.5),
                                                         (0.7, 1.4, 0.8, 0.9, 0.4)])))
    out = subprocess.run([sys.executable, "-m", "benchmarks.arms_table", str(tmp_path / "a"), "--reference", "v3",
                          str(tmp_path / "ref.json")], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith("| ") and "---" not in x][1:]
    assert len(lines) == 6 and lines[3].startswith("| a | 40 | 800 | 1.00 |") and lines[3].endswith("| yes | 2/0/0 |")


def test_arms_table_reads_a_curve_at_the_references_speeds(load_script):
    arms = load_script("arms_table")
    curve = arms.points(_eval([(1.0, 1.0, 0.5, 0.5, 0.5), (0.9, 1.2, 0.6, 0.6, 0.5), (0.7, 1.4, 0.9, 0.9, 0.5)]), 0.5)
    assert arms.nll_at(curve, 1.1, "nll_x_ar") == pytest.approx(1.1)  # halfway between 1.0 and 1.2
    assert arms.nll_at(curve, 1.3, "nll_x_ar") == pytest.approx(1.5)
    assert arms.nll_at(curve, 1.4, "nll_x_ar") == pytest.approx(1.8)
    assert arms.nll_at(curve, 1.41, "nll_x_ar") is None  # faster than the curve's fastest point
    # the reference: one point below the curve, one above it, one the curve does not reach
    ref = arms.points(_eval([(1.0, 1.0, 0.5, 0.5, 0.5), (0.9, 1.1, 0.52, 0.52, 0.5), (0.8, 1.3, 0.8, 0.8, 0.5),
                             (0.7, 1.5, 0.9, 0.9, 0.5)]), 0.5)
    assert arms.at_ref_speeds(curve, ref, "nll_x_ar") == {"better": 1, "worse": 1, "beyond": 1}
    assert not arms.dominates(curve, ref) and not arms.dominates(ref, curve)


def test_arms_table_judges_by_the_bare_model_when_asked(tmp_path, load_script):
    """A merged adapter whose own AR mode drifted looks cheap under its own AR mode and dear under the bare
    model; --judge bare puts both arms under the one yardstick."""
    arms = load_script("arms_table")
    drifted = _eval([(1.0, 1.0, 0.5, 0.65, 0.3), (0.9, 1.2, 0.55, 0.75, 0.3)])  # own AR: 1.1x; bare: 1.5x
    gated = _eval([(1.0, 1.0, 0.5, 0.5, 0.5), (0.9, 1.2, 0.65, 0.65, 0.5)])  # own AR = bare: 1.3x
    bare = {"decoding": [{"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.5}]}
    for name, ev in (("drifted", drifted), ("gated", gated), ("bare", bare)):
        (tmp_path / f"{name}.json").write_text(json.dumps(ev))
    cmd = [sys.executable, "-m", "benchmarks.arms_table", f"gated={tmp_path / 'gated.json'}", "--reference", "drifted",
           str(tmp_path / "drifted.json"), "--bare", str(tmp_path / "bare.json")]
    rows = {}
    for judge in ("ar", "bare"):
        out = subprocess.run(cmd + ["--judge", judge], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        rows[judge] = [x for x in out.stdout.splitlines() if x.startswith("| gated |")][0]
    assert rows["ar"].endswith("| no | 0/1/0 |")
    assert rows["bare"].endswith("| yes | 1/0/0 |")
    out = subprocess.run(cmd[:-2] + ["--judge", "bare"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "--judge bare needs --bare" in out.stderr


def test_the_card_of_a_gated_adapter_says_how_it_departs_from_the_paper(tmp_path):
    _run(tmp_path / "g", 10, 600.0, gated=True)
    ev = {"examples": 3, "block_size": 4,
          "draft_accuracy": {"accuracy_by_distance": {"2": 0.3}, "est_tokens_per_pass": 1.4, "calibration": []},
          "decoding": [{"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.4}]}
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    cmd = [sys.executable, "-m", "tools.ship_adapter", "--run", str(tmp_path / "g"), "--eval", str(tmp_path / "eval.json"),
           "--dest", str(tmp_path / "out")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    card = (tmp_path / "out" / "README.md").read_text()
    assert "gated LoRA adapter" in card and "not merged" in card and "departs from the paper" in card
    assert "gated: no clean loss" in card and "`data/selfdistill/magpie.jsonl.gz`" in card
    assert "merged into the base weights" not in card and "shifts the model's own tau = 1.0" not in card


def test_pareto_points_judge_every_checkpoint_by_one_model():
    from mars.evaluation.plots import pareto_points

    merged = {"adapter": "assets/mars-adapter", "decoding": [
        {"tau": 0.9, "tokens_per_pass": 1.2, "mean_nll_under_ar": 0.6, "mean_nll_under_bare": 0.7},
        {"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.5, "mean_nll_under_bare": 0.65}]}
    bare = {"adapter": None, "decoding": [{"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.43}]}
    assert pareto_points(merged) == [(1.0, 1.0, 0.5), (0.9, 1.2, 0.6)]
    assert pareto_points(merged, "bare") == [(1.0, 1.0, 0.65), (0.9, 1.2, 0.7)]
    assert pareto_points(bare, "bare") == [(1.0, 1.0, 0.43)]  # the bare model's own AR NLL is the yardstick
    old = {"adapter": "x", "decoding": [{"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.5}]}
    assert pareto_points(old, "bare") == []  # an adapter's eval without the bare model's NLL: nothing to draw


def test_ship_refuses_a_compare_eval_that_is_not_there(tmp_path):
    _run(tmp_path / "g", 10, 600.0, gated=True)
    ev = {"examples": 3, "block_size": 4,
          "draft_accuracy": {"accuracy_by_distance": {"2": 0.3}, "est_tokens_per_pass": 1.4, "calibration": []},
          "decoding": [{"tau": 1.0, "tokens_per_pass": 1.0, "mean_nll_under_ar": 0.4, "mean_nll_under_bare": 0.4}]}
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    cmd = [sys.executable, "-m", "tools.ship_adapter", "--run", str(tmp_path / "g"), "--eval", str(tmp_path / "eval.json"),
           "--dest", str(tmp_path / "out"), "--judge", "bare"]
    r = subprocess.run(cmd + ["--compare", f"v3={tmp_path / 'missing.json'}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "NAME=EVAL_JSON" in r.stderr and not (tmp_path / "out").exists()
    (tmp_path / "v3.json").write_text(json.dumps(ev))
    r = subprocess.run(cmd + ["--compare", f"v3={tmp_path / 'v3.json'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 5000
