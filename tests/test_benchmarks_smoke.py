"""Every benchmark in benchmarks/ runs, as a module from the repository root, on the tiny model with minimal
arguments and prints (or writes) a sane result. Slow: each is its own process (~5-20 s on a shared 2-core
machine). benchmarks.arms_table is run the same way, on every run, by tests/test_ship.py."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def bench(name: str, *args, env=None, timeout=300) -> str:
    r = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *map(str, args)], cwd=ROOT, capture_output=True,
                       text=True, env={**ENV, **(env or {})}, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    """Training rows in the chat format the trainer reads."""
    row = {"messages": [{"role": "user", "content": "what is the capital of france ?"},
                        {"role": "assistant", "content": "the capital of france is paris . it is a great city ."}]}
    path = tmp_path_factory.mktemp("data") / "d.jsonl"
    path.write_text((json.dumps(row) + "\n") * 8)
    return path


def test_pass_cost(tiny_dir, tmp_path):
    out = tmp_path / "pc.json"
    text = bench("pass_cost", "--model", tiny_dir, "--backends", "hf", "fast", "--widths", 1, 4, "--rounds", 2,
                 "--prompt-len", 16, "--out", out, "--probe")
    assert "hf time / backend time" in text and "machine before:" in text and "machine after:" in text
    res = json.loads(out.read_text())
    for when in ("before", "after"):  # the machine probe's reading, or why there is none
        r = res["machine_probe"][when]
        assert "unavailable" in r or (r["gmac_per_s"]["2 threads, 16 rows"] > 0 and r["second_thread_gain_16_rows"] > 0)
    for stat in ("median", "min"):
        assert set(res["ms_per_pass"][stat]) == {"hf", "fast"}
        assert all(ms > 0 for row in res["ms_per_pass"][stat].values() for ms in row.values())


def test_host_cost():
    text = bench("host_cost", "--modes", "ar", "mars:0.9", "--batches", 1, "--max-new", 12, "--repeats", 1)
    rows = [m.groups() for m in re.finditer(r"^(\S+)\s+(\d+) (\S+)\s+([\d.]+) \(\s*(\d+)\)", text, re.M)]
    assert {(r[0], r[2]) for r in rows} == {(m, b) for m in ("ar", "mars:0.9") for b in ("stub", "static", "device")}
    for mode, batch, backend, ms, passes in rows:
        assert batch == "1" and float(ms) > 0
        assert int(passes) == 12 if mode == "ar" else 1 <= int(passes) <= 12  # AR: a pass a token


def test_step_cost(tiny_dir, chat_data):
    text = bench("step_cost", "--model", tiny_dir, "--data", chat_data, "--rounds", 2, "--batch-size", 2,
                 "--max-length", 64)
    res = json.loads(text.strip().splitlines()[-1])
    assert res["rounds"] == 2 and res["tokens_per_micro_batch"] > 0
    assert {"standard", "gated-one", "gated"} <= set(res["median_seconds"])
    assert res["ratio_to_standard"]["standard"] == 1.0 and all(s > 0 for s in res["median_seconds"].values())


def test_sdpa_probe(tiny_dir, chat_data):
    res = json.loads(bench("sdpa_probe", "--device", "cpu", "--model", tiny_dir, "--data", chat_data, "--batch", 2,
                           "--max-length", 64).strip().splitlines()[-1])
    assert res["device"] == "cpu" and res["attn_implementation"] == "sdpa" and res["shape"][0] == 2
    assert res["kernels"]["math"] == "runs" and set(res["kernels"]) == {"flash", "efficient", "math"}


def test_int8_quality(tiny_dir, tmp_path):
    out = tmp_path / "q.json"
    bench("int8_quality", "--model", tiny_dir, "--limit", 2, "--known-limit", 2, "--max-new-tokens", 8,
          "--threads", 1, "--json", out)
    rows = json.loads(out.read_text())
    assert [r["backend"] for r in rows] == ["fast", "fast-int8"]
    assert rows[0]["nll_ratio"] == 1.0 and rows[0]["exact_match"] == 1.0  # the reference against itself
    assert rows[1]["nll_ratio"] > 0 and 0 <= rows[1]["prefix_match"] <= 1 and rows[1]["known_total"] == 2


def test_tree_shapes(tiny_dir):
    text = bench("tree_shapes", "2/4", "2/4sc", "--model", tiny_dir, "--prompts", 0, 1, "--max-new-tokens", 12,
                 "--threads", 1)
    assert "pass costs by inputs:" in text  # "c": the costs measured once
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.endswith("x AR")}
    assert set(lines) == {"ar", "2/4", "2/4sc"}
    assert "1.000x AR" in lines["ar"]
    for ln in lines.values():
        tokens_per_pass = float(re.search(r"([\d.]+) tokens/pass", ln).group(1))
        assert tokens_per_pass >= 1.0 and float(re.search(r"([\d.]+) tokens/s", ln).group(1)) > 0


def test_verified_blocks(tiny_dir):
    text = bench("verified_blocks", "--model", tiny_dir, "--limit", 2, "--max-new-tokens", 12, "--blocks", 2,
                 "--tree-nodes", 0, 4, "--threads", 1)
    rows = {ln[:31].strip(): ln[31:].split() for ln in text.splitlines() if ln.startswith(("ar ", "verified B"))}
    assert set(rows) == {"ar", "verified B 2 tau 0", "verified B 2 tau 0 tree 4"}
    assert rows["ar"][0] == "1.000" and rows["ar"][4] == "1.00x"  # AR: one token a pass, itself
    for r in rows.values():
        assert float(r[0]) >= 1.0 and float(r[1]) >= 1.0 and float(r[3]) > 0  # tokens and inputs a pass, tok/s


@pytest.mark.needs_c
def test_kernel_ab(tiny_dir, tmp_path, load_script):
    root = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.split()[0]
    with pytest.raises(SystemExit, match="no mars/runtime/csrc/mars_kernels.h at this revision"):
        load_script("kernel_ab").source_at(root, tmp_path / "old")  # the C was Python strings then
    text = bench("kernel_ab", "HEAD", "--model", tiny_dir, "--stages", "--widths", 1, 2, "--rounds", 2,
                 "--prompt-len", 16, "--threads", 1)
    head = next(ln for ln in text.splitlines() if ln.startswith("HEAD:"))
    cells = re.findall(r"W(\d+)\s+([\d.]+) \(([\d.]+)\)", head)
    assert [c[0] for c in cells] == ["1", "2"] and cells[0][2] == "1.00" and all(float(c[1]) > 0 for c in cells)
    steps = {ln.split()[0] for ln in text.split("microseconds per pass by step")[1].splitlines()[2:] if ln.strip()}
    assert {"norm1", "qkv", "attention", "down", "rest"} <= steps


def test_cost_drift(tiny_dir, tmp_path):
    out = tmp_path / "drift.json"
    text = bench("cost_drift", "--repeat", 2, "--every", 0, "--json", out, env={"MARS_MODEL": str(tiny_dir)})
    assert "slope over 2 measurements" in text
    res = json.loads(out.read_text())
    assert res["model"] == str(tiny_dir) and len(res["rows"]) == 2
    for row in res["rows"]:
        assert len(row["by_width"]) >= 8 and row["by_width"][0] == 1.0  # relative to a pass of one input
        assert all(c > 0 for c in row["by_width"]) and row["group"] >= 0


def test_stutter_table(tmp_path):
    def ev(name, points):  # (tau, tokens/pass, NLL under the bare model, stutter per 100 words)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"decoding": [
            {"tau": t, "tokens_per_pass": s, "mean_nll_under_bare": n, "stutter": {"per_100_words": st,
             "texts_with_stutter": st / 10}, "repeat_guard_stops": 1} for t, s, n, st in points]}))
        return path

    off = ev("off", [(1.0, 1.0, 2.0, 0.0), (0.9, 1.5, 2.2, 1.0), (0.7, 2.0, 2.6, 3.0)])
    on = ev("on", [(1.0, 1.0, 2.0, 0.0), (0.7, 1.75, 2.2, 0.5)])
    out = tmp_path / "points.json"
    text = bench("stutter_table", f"guard={on}", "--reference", f"off={off}", "--json", out)
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()[2:] if ln.startswith("|")]
    assert len(rows) == 5 and rows[0][0] == "off" and rows[3][0] == "guard"
    assert rows[4][1:5] == ["0.70", "1.750", "1.100", "1.200"]  # the guard's point; off at its speed: 2.4 / 2.0
    assert json.loads(out.read_text())["guard"][1]["nll_x_bare"] == pytest.approx(1.1)


def test_same_records(tiny_dir, tmp_path):
    """Two recordings of the same commit are identical; a changed token is reported and fails the compare."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        bench("same_records", "--model", tiny_dir, "--out", out, "--limit", 2, "--max-new-tokens", 8,
              "--taus", 0.5, "--backends", "fast", "--threads", 1)
    text = bench("same_records", "--compare", a, b)
    assert text.splitlines()[-1] == "all identical" and text.count("identical") == 6  # 5 methods + the verdict
    runs = json.loads(b.read_text())
    runs[1]["outputs"][0][0] += 1
    b.write_text(json.dumps(runs))
    r = subprocess.run([sys.executable, "-m", "benchmarks.same_records", "--compare", str(a), str(b)], cwd=ROOT,
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 1 and "DIFFERENT" in r.stdout and r.stdout.splitlines()[-1] == "some runs differ"


def test_accept_lab(tiny_dir, tmp_path):
    out = tmp_path / "lab.json"
    text = bench("accept_lab", "--model", tiny_dir, "--adapter", "none", "--backend", "hf", "--max-new-tokens", 8,
                 "--rounds", 1, "--threads", 1, "--out", out, "--probe")
    data = json.loads(out.read_text())
    assert json.loads(text) == data and data["prompts"] == 16 and data["answer_tokens"] > 0
    assert set(data["machine_probe"]) == {"before", "after"}
    assert set(data["lab"]) == {"answers", "drafts", "analysis", "whole"}
    assert data["lab"]["whole"]["min_s"] >= data["lab"]["drafts"]["min_s"] > 0 and data["lab"]["answers"]["rounds"]
    packed, alone = data["drafts"]["1024 rows per forward"], data["drafts"]["one answer per forward"]
    assert packed["forwards"] < alone["forwards"] and packed["min_s"] > 0


def test_app_defaults(tiny_dir, tmp_path):
    out = tmp_path / "defaults.json"
    text = bench("app_defaults", "--model", tiny_dir, "--adapter", "none", "--limit", 2, "--max-new-tokens", 6,
                 "--threads", 1, "--candidates", "verified:2:4", "mars:3:0.9", "--out", out)
    rows = {r["candidate"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "verified:2:4", "mars:3:0.9"}
    assert rows["ar"]["vs_ar"] == 1.0 and rows["ar"]["equals_ar"] == 2
    assert rows["verified:2:4"]["equals_ar"] == 2  # lossless: AR's text on both prompts
    assert rows["mars:3:0.9"]["equals_ar"] is None and all(r["tokens"] > 0 for r in rows.values())
    assert "verified:2:4" in text


def test_machine_probe(tmp_path):
    out = tmp_path / "probe.json"
    text = bench("machine_probe", "--rounds", 1, "--calls", 2, "--json", out)
    assert "the second thread" in text
    res = json.loads(out.read_text())
    assert set(res["gmac_per_s"]) == {f"{t} threads, {n} rows" for t in (1, 2) for n in (1, 16)}
    assert all(len(v) == 1 and v[0] > 0 for v in res["gmac_per_s"].values())
    assert set(res["second_thread_gain"]) == {"1 rows", "16 rows"}


def test_room(tiny_dir):
    out = bench("room", "--model", tiny_dir, "--rows", 6, "--mode", "mars", "--max-new-tokens", 12, "--solo", 3,
                "--threads", 1)
    assert re.search(r"room: \d+ tokens in [\d.]+ s", out) and "rows equal to their solo run: 3/3" in out


def test_serve_load(tiny_dir, tmp_path):
    out = bench("serve_load", "--clients", 1, 3, "--max-new-tokens", 8, "--page", 1, "--json", tmp_path / "s.json",
                env={"MARS_MODEL": str(tiny_dir), "MARS_THREADS": "1"}, timeout=600)
    data = json.loads((tmp_path / "s.json").read_text())
    assert set(data["on"]) == set(data["off"]) == {"1", "3"} and data["peer"] is None
    assert all(room["errors"] == 0 for room in list(data["on"].values()) + list(data["off"].values()))
    assert "| 3 + 1 page |" in out and "8/8 (off 8/8)" in out  # every answer its solo text, both ways
