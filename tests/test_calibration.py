"""Draft calibration (issue 13 item 4): per-mask-index temperatures, fitted on held-out teacher-forced
drafts, recorded in mars.json, applied to every mask proposal's confidence (never to the AR token)."""

import json
from pathlib import Path

import pytest
import torch

import tiny
from mars.decoding.acceptance import calibrate_logits, choose_and_score
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.decoding.modes import MarsMode, VerifiedMode, make_mode

ROOT = Path(__file__).resolve().parent.parent


def test_calibrate_logits_divides_mask_rows_only():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 9, generator=g)
    out = calibrate_logits(z, [2.0, 0.5], ar_rows=1)
    assert torch.equal(out[0], z[0])  # the AR token is untouched
    assert torch.allclose(out[1], z[1] / 2.0) and torch.allclose(out[2], z[2] / 0.5)
    assert torch.equal(out[3], z[3])  # past the fitted masks: T = 1
    assert torch.allclose(calibrate_logits(z, [2.0, 0.5, 4.0, 8.0], ar_rows=0), z / torch.tensor([[2.0], [0.5], [4.0], [8.0]]))
    assert calibrate_logits(z, None) is z and calibrate_logits(z, []) is z


def test_confidence_uses_calibrated_logits_but_the_token_does_not_move():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 20, generator=g) * 3
    cal = calibrate_logits(z, [3.0, 3.0])
    for measure in ("prob", "entropy", "margin"):
        tok, conf = choose_and_score(z, measure, confidence_logits=cal)
        tok_raw, conf_raw = choose_and_score(z, measure)
        _, conf_cal = choose_and_score(cal, measure)
        assert torch.equal(tok, tok_raw)
        assert torch.allclose(conf, conf_cal)
        # the AR row is not calibrated: the same confidence (to rounding: greedy "prob" without calibration runs
        # in one C call, mars.runtime.kernels.argmax_conf, the calibrated one as tensor ops)
        assert torch.isclose(conf[0], conf_raw[0], rtol=1e-6, atol=0) and not torch.allclose(conf[1:], conf_raw[1:])


class _Row:
    drafts, draft_conf = [], []
    tokens: list = []  # the text so far: the repeat guard reads it


def test_modes_apply_the_temperatures():
    # the drafts here repeat one token ([1, 2, 2, 2]): the repeat guard would stop them; this is about calibration
    cfg = DecodeConfig(mode="mars", block_size=4, tau=0.5, repeat_tau=None)
    V = 10
    main = torch.full((1, V), -5.0)
    main[0, 1] = 5.0
    group = torch.full((3, V), 0.0)
    group[:, 2] = 2.0  # raw p(2) = e^2 / (e^2 + 9) = 0.45: rejected at tau 0.5
    raw = MarsMode().accept(_Row(), None, main, [group], cfg, 0.5, None)
    assert raw.tokens == [1]
    sharp = MarsMode([0.25, 0.25, 0.25]).accept(_Row(), None, main, [group], cfg, 0.5, None)
    assert sharp.tokens == [1, 2, 2, 2]  # p(2) at T = 0.25: e^8 / (e^8 + 9) = 0.997
    assert sharp.confidences[0] == raw.confidences[0]
    assert sharp.confidences[1] == pytest.approx(torch.softmax(group[0] / 0.25, -1)[2].item())
    # verified: the drafts it keeps for the next pass follow the calibrated confidence
    vcfg = DecodeConfig(mode="verified", block_size=4, tau=0.5)
    plan = VerifiedMode().plan(_Row(), vcfg, 0.5)
    row = _Row()
    VerifiedMode("all", [0.25] * 3).accept(row, plan, main, [group], vcfg, 0.5, None)
    assert row.drafts == [2, 2, 2]
    row = _Row()
    VerifiedMode("all").accept(row, plan, main, [group], vcfg, 0.5, None)
    assert row.drafts == []
    lm = type("LM", (), {"calibration": {"temperatures": [0.5, 2.0]}})()
    assert make_mode(cfg, lm).temperatures == [0.5, 2.0] and make_mode(cfg).temperatures is None


@pytest.mark.parametrize("backend", ["hf", "auto"])
def test_decoding_with_a_calibrated_model(backend):
    lm = tiny.make_loaded("llama")
    prompt = encode_prompt(lm.tokenizer, "what is the capital of france ?")
    ar = generate_ids(lm, [prompt], DecodeConfig(mode="ar", max_new_tokens=20, backend=backend))[0]

    def run(temps, **kw):
        lm.calibration = {"temperatures": temps} if temps else None
        return generate_ids(lm, [prompt], DecodeConfig(max_new_tokens=20, backend=backend, **kw))[0]

    assert run([0.01] * 3, mode="mars", tau=1.0).token_ids == ar.token_ids  # tau 1.0 stays AR
    assert run([0.01] * 3, mode="verified", tau=0.5).token_ids == ar.token_ids  # still lossless
    plain = run(None, mode="mars", tau=0.9)
    sharp = run([0.01] * 3, mode="mars", tau=0.9)
    flat = run([100.0] * 3, mode="mars", tau=0.9)
    assert sharp.tokens_per_pass > plain.tokens_per_pass >= flat.tokens_per_pass == 1.0
    assert run([0.01] * 3, mode="mars", tau=0.0).token_ids == run(None, mode="mars", tau=0.0).token_ids


def _nll(lm, examples, B, o, T):
    """Independent: mean NLL of mask slot o's target over the drafts draft_accuracy counts."""
    from mars.training.objective import build_batch, forward_batch

    tot, n = 0.0, 0
    for ex in examples:
        batch = build_batch([ex], B, lm.mask_token_id, lm.eos_token_ids[0])
        Lc = batch.clean_len
        with torch.no_grad():
            z = forward_batch(lm.model, batch)[0, Lc:].double()
        lab, start, p = batch.noisy_labels[0], int(batch.position_ids[0, Lc]), len(ex.prompt_ids)
        for blk in range(0, len(lab), B):
            if start + blk < p:
                continue
            ok = all(blk + k < len(lab) and lab[blk + k] >= 0 for k in range(o + 1))
            if ok:
                i = blk + o
                tot += -torch.log_softmax(z[i] / T, -1)[lab[i]].item()
                n += 1
    return tot / n


def test_fit_temperatures_minimises_the_nll_per_mask_index(tiny_lm):
    from mars.evaluation.evaluate import draft_accuracy, fit_temperatures
    from mars.training.objective import Example

    g = torch.Generator().manual_seed(0)
    V = len(tiny_lm.tokenizer)
    exs = []
    for s in range(6):
        ids = torch.randint(10, V, (25,), generator=g).tolist()
        exs.append(Example(ids[:5], ids[5:]))
    B = 4
    fit = fit_temperatures(tiny_lm, exs, B)
    assert len(fit["temperatures"]) == B - 1
    for o, T in enumerate(fit["temperatures"]):
        assert fit["nll_after"][o] == pytest.approx(_nll(tiny_lm, exs, B, o, T), rel=1e-6)
        assert fit["nll_before"][o] == pytest.approx(_nll(tiny_lm, exs, B, o, 1.0), rel=1e-6)
        assert fit["nll_after"][o] <= fit["nll_before"][o]
    assert fit["temperatures"] != [1.0] * 3  # random targets: the random model is far from calibrated
    before = draft_accuracy(tiny_lm, exs, B)
    after = draft_accuracy(tiny_lm, exs, B, temperatures=fit["temperatures"])
    assert before.accuracy_by_distance == after.accuracy_by_distance  # argmaxes do not move
    assert sum(fit["drafts"]) == sum(before.count_by_distance.values())


@pytest.mark.slow  # ~30-60 s on a quiet 2-core machine: the default run stays under ~15 min
def test_calibrate_cli_writes_a_calibrated_copy_that_loads(tiny_dir, tmp_path):
    from mars.models.loading import load
    from test_cli_train import _data, run_cli, train_args

    data = _data(tmp_path / "d.jsonl")
    out = run_cli(*train_args(tiny_dir, data, tmp_path / "a", 2))
    assert out.returncode == 0, out.stderr
    src_meta = (tmp_path / "a" / "mars.json").read_text()
    cal = run_cli("calibrate", "--model", str(tiny_dir), "--adapter", str(tmp_path / "a"), "--data", str(data),
                  "--limit", "8", "--out", str(tmp_path / "c"))
    assert cal.returncode == 0, cal.stderr
    summary = json.loads(cal.stdout.splitlines()[-1])
    assert len(summary["temperatures"]) == 3 and {"count", "right", "share", "precision"} <= set(summary["before"])
    assert (tmp_path / "a" / "mars.json").read_text() == src_meta  # the source adapter is not changed
    meta = json.loads((tmp_path / "c" / "mars.json").read_text())
    assert meta["calibration"]["temperatures"] == summary["temperatures"] and meta["block_size"] == 4
    lm = load(str(tiny_dir), adapter=str(tmp_path / "c"))
    assert lm.calibration["temperatures"] == summary["temperatures"] and lm.describe()["calibration"]
    assert load(str(tiny_dir), adapter=str(tmp_path / "a")).calibration is None
    meta["calibration"] = {"temperatures": [1.0, -2.0]}
    (tmp_path / "c" / "mars.json").write_text(json.dumps(meta))
    bad = load(str(tiny_dir), adapter=str(tmp_path / "c"))
    assert bad.calibration is None and any("calibration" in w for w in bad.warnings)
    same = run_cli("calibrate", "--model", str(tiny_dir), "--adapter", str(tmp_path / "a"), "--data", str(data),
                   "--out", str(tmp_path / "a"))
    assert same.returncode == 2 and "source adapter" in same.stderr


class HalfRight(torch.nn.Module):
    """Puts logit `c` on one token everywhere: the true next token, except at masks in odd blocks (by
    t // 4), where it is a wrong one. Each mask slot is then right half the time, and its NLL is least
    where softmax gives that token 0.5: c / T = log(V - 1)."""

    def __init__(self, seq, V, mask_id, c=10.0):
        super().__init__()
        self.seq, self.V, self.mask_id, self.c = seq, V, mask_id, c
        self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def forward(self, input_ids, position_ids, attention_mask=None, **_):
        b, n = input_ids.shape
        logits = torch.zeros(b, n, self.V, dtype=torch.float64)
        for i in range(n):
            t = int(position_ids[0, i])
            y = self.seq[t + 1] if t + 1 < len(self.seq) else 2
            if int(input_ids[0, i]) == self.mask_id and (t // 4) % 2:
                y = (y + 1) % self.V
            logits[0, i, y] = self.c
        return type("Out", (), {"logits": logits})()


def test_fit_temperatures_finds_the_analytic_optimum():
    import math

    from mars.evaluation.evaluate import draft_accuracy, fit_temperatures
    from mars.training.objective import Example

    V, mask = 64, 3
    prompt, resp = [5, 6, 7, 8], list(range(20, 51)) + [2]  # 8 response blocks: 4 right, 4 wrong per slot
    lm = type("LM", (), {})()
    lm.model, lm.mask_token_id, lm.eos_token_ids = HalfRight(prompt + resp, V, mask), mask, [2]
    fit = fit_temperatures(lm, [Example(prompt, resp)], 4)
    want = 10.0 / math.log(V - 1)
    assert fit["drafts"] == [8, 8, 8]
    for T, nll in zip(fit["temperatures"], fit["nll_after"]):
        assert T == pytest.approx(want, rel=0.011)  # the grid's 2% steps
        assert nll == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 * (V - 1)), rel=1e-3)
    before = draft_accuracy(lm, [Example(prompt, resp)], 4)
    after = draft_accuracy(lm, [Example(prompt, resp)], 4, temperatures=fit["temperatures"])
    assert before.confident["share"] == 1.0 and before.confident["precision"] == 0.5  # p = 0.9997 on every draft
    assert after.confident["count"] == 0 and after.confident["precision"] is None  # calibrated: p = 0.5
