"""int8 matrices (mars/runtime/quant.py, backend "fast-int8"): the kernel against a by-hand quantized product,
rows independent (batch = alone, verified = the int8 model's own AR greedy), float gated deltas, and the same
exact integers on a CPU without VNNI (oneDNN limited to AVX2 in a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tiny
from mars.runtime.fastpath import fast_model
from mars.runtime.backends import BACKENDS, FastBackend, HFBackend
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.runtime.quant import OUTLIERS, WEIGHT_MAX, Int8Linear, quantize_rows, quantize_weight, reference_linear

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["what is the capital of france ?", "tell me a word", "write a long sentence about the water and the earth"]


def linears(shapes, bias: bool, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mods = []
    for out_f, in_f in shapes:
        m = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
        with torch.no_grad():
            m.weight.copy_(torch.randn(out_f, in_f, generator=g, dtype=dtype))
            if bias:
                m.bias.copy_(torch.randn(out_f, generator=g, dtype=dtype))
        mods.append(m)
    return mods


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_equals_the_quantized_product_by_hand(dtype, bias):
    mods = linears([(48, 96), (16, 96), (16, 96)], bias, dtype)  # fused, as q|k|v
    lin = Int8Linear(mods)
    w = torch.cat([m.weight for m in mods]).detach()
    b = torch.cat([m.bias for m in mods]).detach() if bias else None
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 1, 96), (1, 5, 96), (2, 4, 96), (8, 96)]:
        x = torch.randn(shape, generator=g, dtype=dtype) * 3
        x[..., 7] *= 40  # an outlier channel, as real activations have
        y = lin(x)
        assert y.shape == shape[:-1] + (80,) and y.dtype == dtype
        torch.testing.assert_close(y, reference_linear(x, w, b), rtol=1e-6, atol=1e-6)
        exact = F.linear(x, w, b)
        assert ((y - exact).norm() / exact.norm()) < 0.05  # 7-bit weights, ~16-bit rows: close, not equal


def test_quantizers_bounds_and_zero_rows():
    w = torch.randn(32, 64) * torch.logspace(-3, 2, 32)[:, None]  # rows of very different scales
    q, s = quantize_weight(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == WEIGHT_MAX
    assert (q.abs().amax(1) == WEIGHT_MAX).all()  # every row uses its whole range
    torch.testing.assert_close(q.float() * s[:, None], w, rtol=0, atol=float(s.max()) / 2 + 1e-6)
    x = torch.randn(3, 64)
    x[1] = 0
    x[2, 5] = 500.0  # one huge value: kept apart, it does not coarsen the row's grid
    xq, sx, ov, oi = quantize_rows(x)  # (3, 64) int8, one row each, and each row's OUTLIERS largest values
    assert xq.shape == (3, 64) and xq[1].eq(0).all() and torch.isfinite(sx).all()  # zero row: no 0/0
    assert int(xq[0].abs().max()) == 127 and ov.shape == oi.shape == (3, OUTLIERS) and oi[2, 0] == 5
    back = xq.double() * sx[:, None].double()
    back.scatter_(1, oi, ov.double())  # the outliers, exactly
    assert ((back - x).abs().amax(1) <= sx / 2 + 1e-7).all()  # half a step of the rest's grid at most
    assert sx[2] < 5 / 127  # the grid is the rest's (randn: |x| < 5), not 500's


def test_rows_are_independent():
    """A row's output does not depend on the other rows of its pass (one scale per pass would break this)."""
    lin = Int8Linear(linears([(40, 64)], True, torch.float32))
    x = torch.randn(6, 64)
    x[3] *= 1000  # a huge row beside small ones
    together = lin(x)
    for r in range(6):
        assert torch.equal(lin(x[r:r + 1])[0], together[r])


def test_fast_int8_is_a_backend_and_close_to_float():
    assert "fast-int8" in BACKENDS
    lm = tiny.make_loaded("qwen2", seed=3, dtype=torch.float32)  # q/k/v biases
    ids = torch.tensor([encode_prompt(lm.tokenizer, PROMPTS[2])])
    P = ids.shape[1]
    args = (ids, torch.arange(P)[None], torch.tril(torch.ones(P, P, dtype=torch.bool))[None], list(range(P)))
    ref = HFBackend(lm.model).forward(*args)
    q = FastBackend(fast_model(lm.model, torch.int8), 1, P).forward(*args)
    err = (q - ref).norm() / ref.norm()
    assert 0 < err < 0.3  # a random 2-layer model: errors of 7-bit weights and 8-bit rows add up, not blow up


@pytest.mark.parametrize("arch,dtype", [("llama", torch.float64), ("qwen2", torch.float32)])
def test_batch_equals_alone_and_lossless_modes_equal_int8_greedy(arch, dtype):
    lm = tiny.make_loaded(arch, seed=4, dtype=dtype)
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
    kw = dict(max_new_tokens=20, backend="fast-int8", cache_block=8)
    ar = [generate_ids(lm, [i], DecodeConfig(mode="ar", **kw))[0].token_ids for i in ids]
    for cfg in (DecodeConfig(mode="ar", **kw), DecodeConfig(mode="mars", tau=1.0, block_size=4, **kw),
                DecodeConfig(mode="verified", tau=0.0, block_size=4, **kw),
                DecodeConfig(mode="verified", tau=0.0, block_size=4, drafts="both", verify_groups="last", **kw),
                DecodeConfig(mode="jacobi", block_size=4, **kw)):
        batch = [r.token_ids for r in generate_ids(lm, ids, cfg)]  # a left-padded batch
        assert batch == ar, cfg.mode
    low = DecodeConfig(mode="mars", tau=0.3, block_size=4, **kw)  # lossy MARS: still batch = alone
    assert [r.token_ids for r in generate_ids(lm, ids, low)] == \
        [generate_ids(lm, [i], low)[0].token_ids for i in ids]


def test_gated_deltas_are_int8_values_added_in_float():
    """The deltas' A and B are stored as int8 with float scales (kernels.quantize_lora), added in float at the
    mask rows only: the real rows are the bare int8 matrix's exactly, the mask rows get those values' delta."""
    from mars.runtime.kernels import dequantized_lora

    mods = linears([(24, 32), (8, 32)], False, torch.float64)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 32, generator=g, dtype=torch.float64), torch.randn(32, 4, generator=g, dtype=torch.float64)
    lin, bare = Int8Linear(mods, (a, b)), Int8Linear(mods)
    x = torch.randn(1, 5, 32, generator=g, dtype=torch.float64)
    gate = torch.tensor([0, 1, 1, 0, 1], dtype=torch.float64)[None, :, None]
    y = lin(x, gate)
    assert torch.equal(y[0, [0, 3]], bare(x)[0, [0, 3]])  # real rows: the int8 base, exactly
    da, db = (t.double() for t in dequantized_lora(a, b))
    torch.testing.assert_close(y[0, [1, 2, 4]], bare(x)[0, [1, 2, 4]] + (x[0, [1, 2, 4]] @ da.T) @ db.T,
                               rtol=1e-12, atol=1e-12)  # mask rows: + the int8 values' delta, in float
    exact = (x[0, [1, 2, 4]] @ a.T) @ b.T
    assert ((y[0, [1, 2, 4]] - bare(x)[0, [1, 2, 4]] - exact).norm() / exact.norm()) < 0.02  # ~1% of the delta


def test_gated_adapter_on_int8_keeps_the_int8_models_greedy_text(tiny_dir, tmp_path):
    from test_gated import random_lora
    from mars.models.loading import load

    out = tmp_path / "adapter"
    random_lora(load(str(tiny_dir), dtype="float64").model).save_pretrained(out, safe_serialization=True)
    (out / "mars.json").write_text(json.dumps({"gated": True, "block_size": 4, "mask_token": "<|mask|>",
                                               "base_model": str(tiny_dir)}))
    bare, gated = load(str(tiny_dir), dtype="float64"), load(str(tiny_dir), adapter=str(out), dtype="float64")
    kw = dict(max_new_tokens=24, block_size=4, backend="fast-int8")
    changed = 0
    for p in PROMPTS:
        ids = [encode_prompt(gated.tokenizer, p)]
        ref = generate_ids(bare, ids, DecodeConfig(mode="ar", **kw))[0].token_ids
        for cfg in (DecodeConfig(mode="mars", tau=1.0, **kw), DecodeConfig(mode="verified", tau=0.0, **kw)):
            assert generate_ids(gated, ids, cfg)[0].token_ids == ref
        low = DecodeConfig(mode="mars", tau=0.0, **kw)
        changed += generate_ids(gated, ids, low)[0].token_ids != generate_ids(bare, ids, low)[0].token_ids
    assert changed  # the adapter's drafts do act on the int8 path


AVX2_SCRIPT = r"""
import json, sys, torch
from tests import tiny
from mars.runtime.quant import WEIGHT_MAX
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
torch.set_num_threads(1)
ok = True
for M in (1, 5):  # the worst case for 16-bit pair sums: every product at its largest magnitude
    for xs in (127, -127):
        for ws in (WEIGHT_MAX, -WEIGHT_MAX):
            x = torch.full((M, 96), xs, dtype=torch.int8)
            w = torch.full((40, 96), ws, dtype=torch.int8)
            ok &= torch.equal(torch._int_mm(x, w.t()).long(), x.long() @ w.long().t())
lm = tiny.make_loaded("qwen2", seed=4, dtype=torch.float32)
ids = [encode_prompt(lm.tokenizer, p) for p in json.loads(sys.argv[1])]
res = generate_ids(lm, ids, DecodeConfig(mode="ar", max_new_tokens=20, backend="fast-int8"))
print(json.dumps({"exact": bool(ok), "tokens": [r.token_ids for r in res]}))
"""


def test_int8_runs_the_same_on_a_cpu_without_vnni():
    """oneDNN capped at AVX2 (no VNNI: 16-bit pair sums that saturate with full-range int8 weights) computes
    the same integers, hence the same text, as this CPU: the Space's AVX2 machines run this very model."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_VERBOSE": "0", "MARS_CPU_FLAGS": "avx avx2 fma sse4_2"}
    run = subprocess.run([sys.executable, "-c", AVX2_SCRIPT, json.dumps(PROMPTS)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["exact"]
    lm = tiny.make_loaded("qwen2", seed=4, dtype=torch.float32)
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
    here = generate_ids(lm, ids, DecodeConfig(mode="ar", max_new_tokens=20, backend="fast-int8"))
    assert got["tokens"] == [r.token_ids for r in here]


def test_pass_cost_times_int8_beside_float(load_script):
    pc = load_script("pass_cost")
    lm = tiny.make_loaded("llama", seed=5, dtype=torch.float32)
    res = pc.measure(lm.model, ["fast", "fast-int8", "floor", "floor-int8"], [1, 4], rounds=1, prompt_len=8)
    assert set(res["median"]) == {"fast", "fast-int8", "floor", "floor-int8"}
    assert all(ms > 0 for row in res["median"].values() for ms in row.values())
    assert "fast-int8" in pc.format_table(res["median"], [1, 4])
    import time

    two = pc.measure(lm.model, ["fast-int8"], [1, 3], rounds=1, prompt_len=8, batch=2, clock=time.process_time)
    assert all(ms > 0 for ms in two["min"]["fast-int8"].values())  # 2 rows of 3 inputs a pass, CPU seconds


def test_backend_quality_reports_int8_against_float():
    from mars.evaluation.backend_quality import backend_quality, format_rows

    lm = tiny.make_loaded("llama", seed=4, dtype=torch.float32)
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
    known = (ids[:2], ["the", "zzz-never"])
    rows = backend_quality(lm, lm, ids, ("fast-int8",), 12, known, batch_size=2)
    ref, q = rows  # the reference backend is added first
    assert ref["backend"] == "fast" and ref["nll_ratio"] == 1.0 and ref["exact_match"] == 1.0
    assert q["backend"] == "fast-int8" and q["nll_ratio"] > 0 and 0 <= q["prefix_match"] <= 1
    assert ref["known_total"] == 2 and ref["known_right"] <= 1  # "zzz-never" is never in a text
    alone = [generate_ids(lm, [i], DecodeConfig(mode="ar", max_new_tokens=12, backend="fast-int8"))[0].token_ids
             for i in ids]
    exact = sum(a == b for a, b in zip(alone, [generate_ids(lm, [i], DecodeConfig(mode="ar", max_new_tokens=12))[0]
                                               .token_ids for i in ids])) / len(ids)
    assert q["exact_match"] == exact  # the rows agree with decoding each prompt alone
    assert "fast-int8" in format_rows(rows)
