"""mars/runtime/kernels.py: the C loops of the int8 path against the tensor ops they replace (the slow,
obvious versions in mars/runtime/quant.py), bit for bit where they promise it, and the int8 matrices with and
without them."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mars.runtime import kernels as ck
from mars.runtime.quant import Int8Linear, outlier_sums, quantize_rows, quantize_weight, reference_linear
from mars.runtime.scoring import C_SCORING

ROOT = Path(__file__).resolve().parent.parent
lib = ck.kernels()
needs_c = pytest.mark.needs_c  # skips without a compiler, fails on a failed build (conftest.py)


def rows(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * 3
    x[:, 3 % k] *= 50  # an outlier channel
    if n > 1:
        x[1] = 0  # a zero row: no 0/0
    return x


def same_rows(got: ck.QRows, x: torch.Tensor) -> bool:
    """The C kernels' rows of x are quantize_rows's, bit for bit (int8 row, scale, outliers and their columns)."""
    q, sx, ov, oi = quantize_rows(x)
    k = x.shape[1]
    return (torch.equal((got.q[:, :k] ^ 128).view(torch.int8), q) and torch.equal(got.sx, sx)
            and torch.equal(got.ov, ov) and torch.equal(got.oi.long(), oi))


@needs_c
@pytest.mark.parametrize("n,k", [(1, 576), (5, 96), (3, 19), (2, 5)])  # k 5: fewer values than outliers
def test_quantized_rows_equal_the_tensor_ops_bit_for_bit(n, k):
    x = rows(n, k)
    kp = ck.padded(k)
    got = ck.quant_rows(lib, x, kp)
    assert got.q.shape == (n, kp) and same_rows(got, x)
    w = torch.randn(k) + 1
    h, hq = ck.rmsnorm_quant(lib, x, w, 1e-5, kp)
    torch.testing.assert_close(h, F.rms_norm(x, (k,), w, 1e-5), rtol=2e-6, atol=1e-6)  # the mean summed in double
    assert same_rows(hq, h)  # its rows quantized exactly as the plain ones
    gu = rows(n, 2 * k, seed=1)
    a, aq = ck.silu_mul_quant(lib, gu, kp)
    torch.testing.assert_close(a, F.silu(gu[:, :k]) * gu[:, k:], rtol=1e-6, atol=1e-6)
    assert same_rows(aq, a)


def test_quantized_rows_keep_the_largest_values_apart():
    """The rule by hand: the OUTLIERS largest |x| (ties: the earlier column) in float, the rest on a grid set
    by the largest value left; a row of only zeros gives zeros and a finite scale."""
    x = torch.zeros(2, 40)
    x[0, :20] = torch.arange(1, 21).float() / 20  # 0.05 .. 1.0
    x[0, 30] = -1000.0  # a huge value: an outlier, not the grid's scale
    x[0, 31] = 1.0  # ties with column 19: column 19 is kept first
    q, sx, ov, oi = quantize_rows(x)
    want = [30, 19, 31, *range(18, 18 - (ck.OUTLIERS - 3), -1)]  # by |x|; 19 before 31 (equal, earlier)
    assert oi[0].tolist() == want and torch.equal(ov[0], x[0, want])
    left = 20 - (ck.OUTLIERS - 2)  # the largest value left: column left - 1
    assert sx[0] == x[0, left - 1] / 127 and q[0, left - 1] == 127
    assert q[0, want].eq(0).all() and q[0].abs().max() <= 127
    assert q[1].eq(0).all() and ov[1].eq(0).all() and torch.isfinite(sx).all()


class threads:
    """torch's (and so the kernels' OpenMP) thread count inside the block, restored after."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.was = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.was)


@needs_c
@pytest.mark.parametrize("m,k", [(37, 19), (48, 96), (960, 576), (16, 1536)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2, 3])  # 3 on two cores: one thread runs late
def test_c_product_equals_the_integer_product_and_the_tensor_rescale(m, k, bias, n_threads):
    with threads(n_threads):
        product_equals_the_integer_product(m, k, bias)


def product_equals_the_integer_product(m, k, bias):
    g = torch.Generator().manual_seed(m + k)
    w = torch.randn(m, k, generator=g)
    q, sw = quantize_weight(w)
    b = torch.randn(m, generator=g) if bias else None
    blocked, wsum = ck.block_weights(lib, q)
    assert torch.equal(wsum, q.sum(1, dtype=torch.int32))
    kp = ck.padded(k)
    for n in (*range(1, 18), ck.MAX_C_ROWS - 1, ck.MAX_C_ROWS):
        x = rows(n, k, seed=n)
        xq = ck.quant_rows(lib, x, kp)
        res = torch.randn(n, m, generator=g)
        y = ck.gemv_rows(lib, xq, blocked, wsum, sw, b, res)
        exact = ((xq.q[:, :k].long() - 128) @ q.long().T).float()  # (n, m) integer sums, exactly
        want = (exact * xq.sx[:, None] + outlier_sums(xq.ov, xq.oi.long(), q)) * sw
        want = res + (want if b is None else want + b)
        assert torch.equal(y, want), n  # the tensor ops' rescale, in the same order: the same bits
        torch.testing.assert_close(y - res, reference_linear(x, w, b), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="at most"):
        ck.gemv_rows(lib, ck.quant_rows(lib, rows(ck.MAX_C_ROWS + 1, k), kp), blocked, wsum, sw, b)


@needs_c
def test_c_product_with_its_delta_is_the_product_then_the_delta_on_any_thread_count():
    """mars_gemv_rows with the gated delta fused in: the bits of the product alone then mars_lora_rows, on 1, 2
    and 3 threads (a wide product's blocks are shared out as the threads come for them; each output is still
    one thread's, its delta added by the thread that wrote it)."""
    k, outs = 96, [40, 24, 24]
    a, b = gated_lora(k, outs, [16, 8, 16])
    lw = ck.LoraWeights.of(a, b, outs)
    g = torch.Generator().manual_seed(3)
    q, sw = quantize_weight(torch.randn(sum(outs), k, generator=g))
    blocked, wsum = ck.block_weights(lib, q)
    bias = torch.randn(sum(outs), generator=g)
    for n in (1, 3, 8, 9, ck.MAX_C_ROWS):
        x, h = rows(n, k, seed=n), torch.randn(n, k, generator=g)
        xq = ck.quant_rows(lib, x, ck.padded(k))
        gated = torch.arange(0, n, 2)  # every other row is a mask's
        with threads(1):
            want = ck.lora_rows(lib, h, gated, lw, ck.gemv_rows(lib, xq, blocked, wsum, sw, bias))
        for t in (1, 2, 3):
            with threads(t):
                got = ck.gemv_rows(lib, xq, blocked, wsum, sw, bias, delta=(h, gated, lw))
            assert torch.equal(got, want), (n, t)


def fused_linear(shapes, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    mods = []
    for o, i in shapes:
        m = torch.nn.Linear(i, o, bias=bias)
        with torch.no_grad():
            m.weight.copy_(torch.randn(o, i, generator=g))
            if bias:
                m.bias.copy_(torch.randn(o, generator=g))
        mods.append(m)
    return mods


@needs_c
@pytest.mark.parametrize("n", [1, 3, 16, 70])  # 70 rows: the C product in tiles of MAX_C_ROWS
def test_int8_matrix_steps_with_and_without_the_c_loops(n):
    """Every step the layer calls (the matrix, RMSNorm before it, SiLU * up before it, the residual after it)
    gives the same numbers through the C loops as through the tensor ops, to float rounding.

    RMSNorm and SiLU are compared on their own in the test above (to rounding): here the rows they give go
    through the tensor ops' product, since a rounding difference before the quantization can move a value
    across a rounding boundary of the int8 grid (a difference of a whole step, ~1e-3: this test failed 5-14 runs
    in 300 that way with an unseeded norm weight)."""
    c = Int8Linear(fused_linear([(40, 64), (24, 64)], bias=True))
    plain = Int8Linear(fused_linear([(40, 64), (24, 64)], bias=True))
    plain._lib = None  # the tensor ops (as on a machine without a compiler)
    x = rows(n, 64)[None]
    w = torch.rand(64, generator=torch.Generator().manual_seed(n)) + 0.5
    torch.testing.assert_close(c(x), plain(x), rtol=1e-5, atol=1e-5)
    h, _ = ck.rmsnorm_quant(lib, x[0], w, 1e-6)
    torch.testing.assert_close(c.normed(x, w, 1e-6), plain(h[None]), rtol=1e-5, atol=1e-5)
    res = torch.randn(1, n, 64)
    torch.testing.assert_close(c.add_to(res, x), res + plain(x), rtol=1e-5, atol=1e-5)
    down = Int8Linear(fused_linear([(64, 32)]))
    plain_down = Int8Linear(fused_linear([(64, 32)]))
    plain_down._lib = None
    gu = rows(n, 64, seed=3)[None]
    a, _ = ck.silu_mul_quant(lib, gu[0])
    torch.testing.assert_close(down.add_silu_to(res, gu), res + plain_down(a[None]), rtol=1e-5, atol=1e-5)


def test_without_a_compiler_the_tensor_ops_run(monkeypatch, tmp_path, env):
    monkeypatch.setattr(ck, "_STATE", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    env.set("MARS_CACHE", str(tmp_path))
    assert ck.kernels() is None and "does not run" in ck.unavailable_reason()
    mods = fused_linear([(40, 64)])
    lin = Int8Linear(mods)
    assert lin._lib is None
    x = rows(2, 64)
    torch.testing.assert_close(lin(x), reference_linear(x, mods[0].weight.detach()), rtol=1e-5, atol=1e-5)
    env.set("MARS_C_KERNELS", "0")
    assert ck.kernels() is None and ck.unavailable_reason() == "MARS_C_KERNELS=0"


AVX2_SCRIPT = r"""
import sys, torch
from mars.runtime import kernels as ck
from mars.runtime.quant import quantize_weight
lib = ck.kernels()
assert lib is not None, ck.unavailable_reason()
g = torch.Generator().manual_seed(0)
q, sw = quantize_weight(torch.randn(40, 96, generator=g))
q[0] = 64; q[1] = -64  # the largest pair sums vpmaddubsw sees
blocked, wsum = ck.block_weights(lib, q)
x = torch.randn(6, 96, generator=g) * 7
xq = ck.quant_rows(lib, x, ck.padded(96))
bias, res = torch.randn(40, generator=g), torch.randn(6, 40, generator=g)
y = torch.stack([ck.gemv_rows(lib, xq, blocked, wsum, sw, None), ck.gemv_rows(lib, xq, blocked, wsum, sw, bias, res)])
a, b, outs = (t.to(torch.float32) for t in torch.load(sys.argv[2]).values())
h, d = torch.randn(6, a.shape[1], generator=g), torch.randn(6, b.shape[0], generator=g)
ck.lora_rows(lib, h, torch.tensor([1, 4, 5]), ck.LoraWeights.of(a, b, outs.long().tolist()), d)
hn, hq = ck.rmsnorm_quant(lib, x, torch.linspace(0.5, 2, 96), 1e-5)
a, aq = ck.silu_mul_quant(lib, torch.randn(6, 192, generator=g) * 4)
logits = torch.randn(3, 1000, generator=g) * 5
from mars.runtime.cpu_layers import attend
att = []
for c in torch.load(sys.argv[3]):  # attention cases: (qkv, cos, sin, k, v, C, allowed, H, KV)
    qkv, cos, sin, k, v, C, allowed, H, KV = c
    att.append((attend(lib, qkv, cos, sin, k, v, C, allowed, H, KV), k, v, qkv))
torch.save({"block": lib.mars_block(), "y": y, "xq": (xq.q, xq.sx, xq.ov, xq.oi), "lora": d,
            "norm": (hn, hq.q, hq.ov), "silu": (a, aq.q, aq.ov),
            "argmax": ck.argmax_conf(logits), "top": ck.top_probs(logits, 5), "attend": att}, sys.argv[1])
"""


def gated_lora(k, outs, ranks, seed=0, dtype=torch.float16):
    """A fused Linear's (A, B) as GatedLoRA.fused builds them (A stacked, B block-diagonal; rank 0: a module
    without a delta), with values that are float16's (as the shipped adapter's)."""
    g = torch.Generator().manual_seed(seed)
    a = [torch.randn(r, k, generator=g).to(dtype).float() for r in ranks]
    b = [torch.randn(m, r, generator=g).div(4).to(dtype).float() for m, r in zip(outs, ranks)]
    return torch.cat(a), torch.block_diag(*b)


@needs_c
def test_the_avx2_build_computes_the_same_numbers(tmp_path):
    """Built for an AVX2-only CPU (MARS_CPU_FLAGS without avx512f: 8-channel blocks, vpmaddubsw), the product
    gives the same floats as this CPU's build: exact integers, the same rescale."""
    out = tmp_path / "avx2.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARS_CPU_FLAGS": "avx avx2 fma sse4_2",
           "MARS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    a, b = gated_lora(96, [40, 24], [8, 16])
    torch.save({"a": a, "b": b, "outs": torch.tensor([40, 24])}, tmp_path / "lora.pt")
    from test_cpu_layers import case, rope_rows

    cases = []  # the C attention (mars.runtime.cpu_layers): hd 64 (16-key blocks with AVX-512), 16, and 40 (plain C)
    for b_, W, C, H, KV, hd in ((2, 5, 41, 9, 3, 64), (1, 3, 20, 4, 2, 16), (1, 2, 9, 2, 1, 40)):
        qkv, k, v, allowed = case(b_, W, C, H, KV, hd, cap=C + W + 3, seed=hd)
        cases.append((qkv, *rope_rows(b_ * W, hd, seed=hd), k, v, C, allowed.to(torch.uint8), H, KV))
    torch.save(cases, tmp_path / "attend.pt")
    run = subprocess.run([sys.executable, "-c", AVX2_SCRIPT, str(out), str(tmp_path / "lora.pt"),
                          str(tmp_path / "attend.pt")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    got = torch.load(out)
    assert got["block"] == 8
    g = torch.Generator().manual_seed(0)
    q, sw = quantize_weight(torch.randn(40, 96, generator=g))
    q[0] = 64
    q[1] = -64
    blocked, wsum = ck.block_weights(lib, q)
    x = torch.randn(6, 96, generator=g) * 7
    xq = ck.quant_rows(lib, x, ck.padded(96))
    assert torch.equal(got["xq"][0][:, :96], xq.q[:, :96])  # the padding columns are never read as values
    assert all(torch.equal(u, v) for u, v in zip(got["xq"][1:], (xq.sx, xq.ov, xq.oi)))
    bias, res = torch.randn(40, generator=g), torch.randn(6, 40, generator=g)
    assert torch.equal(got["y"][0], ck.gemv_rows(lib, xq, blocked, wsum, sw, None))
    assert torch.equal(got["y"][1], ck.gemv_rows(lib, xq, blocked, wsum, sw, bias, res))  # the rescale's adds
    h, d = torch.randn(6, 96, generator=g), torch.randn(6, 64, generator=g)
    ck.lora_rows(lib, h, torch.tensor([1, 4, 5]), ck.LoraWeights.of(a, b, [40, 24]), d)
    assert torch.equal(got["lora"], d)  # the gated delta: the same sums in the same order (F16C either way)
    hn, hq = ck.rmsnorm_quant(lib, x, torch.linspace(0.5, 2, 96), 1e-5)
    a, aq = ck.silu_mul_quant(lib, torch.randn(6, 192, generator=g) * 4)
    logits = torch.randn(3, 1000, generator=g) * 5
    for name, want in (("norm", (hn, hq.q, hq.ov)), ("silu", (a, aq.q, aq.ov)), ("argmax", ck.argmax_conf(logits)),
                       ("top", ck.top_probs(logits, 5))):  # vectorized,
        # the same bits at any width
        assert all(torch.equal(u, v) for u, v in zip(got[name], want)), name
    from mars.runtime.cpu_layers import attend

    for (qkv, cos, sin, k, v, C, allowed, H, KV), theirs in zip(cases, got["attend"]):
        mine = attend(lib, qkv, cos, sin, k, v, C, allowed, H, KV)
        assert all(torch.equal(u, w) for u, w in zip((mine, k, v, qkv), theirs)), k.shape  # the same order of sums


@needs_c
@pytest.mark.parametrize("ranks", [[16, 16, 16], [8, 0, 16], [0, 0, 12]])
def test_c_gated_delta_adds_the_delta_at_the_gated_rows_only(ranks):
    """mars_lora_rows: y[g] += B (A h[g]) at the listed rows, to float rounding of the float64 product; the
    other rows untouched; block_diag's zero blocks skipped (a module without a delta: rank 0); the same bits
    on 1 thread and 2 (A h is summed over two fixed halves)."""
    k, outs = 96, [40, 24, 24]
    a, b = gated_lora(k, outs, ranks)
    w = ck.LoraWeights.of(a, b, outs)
    assert w is not None and w.seg.numel() == 5 * sum(r > 0 for r in ranks)
    g = torch.Generator().manual_seed(1)
    h, y = torch.randn(7, k, generator=g), torch.randn(7, sum(outs), generator=g)
    gated = torch.tensor([0, 2, 3, 6])
    with threads(1):
        one = ck.lora_rows(lib, h, gated, w, y.clone())
    with threads(2):
        two = ck.lora_rows(lib, h, gated, w, y.clone())
    assert torch.equal(one, two)
    ref, exact = y.double(), y.double()
    da, db = ck.dequantized_lora(a, b)  # the int8 values the kernel stores, as floats
    ref[gated] += (h[gated].double() @ da.double().T) @ db.double().T
    torch.testing.assert_close(two, ref.float(), rtol=1e-5, atol=1e-4)
    exact[gated] += (h[gated].double() @ a.double().T) @ b.double().T
    delta = (exact - y.double())[gated]
    assert ((two.double() - exact)[gated].norm() / delta.norm()) < 0.02  # int8 A and B: ~1% of the delta
    real = torch.tensor([1, 4, 5])
    assert torch.equal(two[real], y[real])


@needs_c
def test_c_gated_delta_of_an_untrained_adapter_is_zero():
    """B all zeros (peft's initial lora_B): no segment to read; y is left as it is, alone or in the product."""
    a, b = gated_lora(64, [40, 24], [8, 8])
    w = ck.LoraWeights.of(a, b * 0, [40, 24])
    assert w is not None and w.seg.numel() == 0
    g = torch.Generator().manual_seed(2)
    h, y = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)
    assert torch.equal(ck.lora_rows(lib, h, torch.tensor([1, 3]), w, y.clone()), y)
    q, sw = quantize_weight(torch.randn(64, 64, generator=g))
    blocked, wsum = ck.block_weights(lib, q)
    xq = ck.quant_rows(lib, h, 64)
    bare = ck.gemv_rows(lib, xq, blocked, wsum, sw, None)
    assert torch.equal(ck.gemv_rows(lib, xq, blocked, wsum, sw, None, None, (h, torch.tensor([1, 3]), w)), bare)
    with pytest.raises(ValueError, match="A takes 64"):
        ck.lora_rows(lib, h[:, :32], torch.tensor([1]), w, y.clone())


def test_c_gated_delta_takes_any_float_values_up_to_its_rank_limit():
    """Float32 values are stored in int8 too (quantize_lora); a rank past MAX_LORA_COLUMNS has no C layout (the
    float tensor ops add it)."""
    a, b = gated_lora(32, [16], [4], dtype=torch.float32)
    w = ck.LoraWeights.of(a, b, [16])
    assert w is not None and w.at.dtype == torch.int8 and w.bt.dtype == torch.int8
    aq, sa, bq, sb = ck.quantize_lora(a, b)
    assert aq.abs().amax(1).eq(ck.LORA_MAX).all() and bq.abs().amax(1).eq(ck.LORA_MAX).all()
    torch.testing.assert_close(aq.float() * sa[:, None], a, rtol=0, atol=float(sa.max()) / 2 + 1e-7)
    a, b = gated_lora(32, [16], [ck.MAX_LORA_COLUMNS + 8])
    assert ck.LoraWeights.of(a, b, [16]) is None  # t = A h would not fit the kernel's buffer


@needs_c
@pytest.mark.parametrize("n", [5, 70])  # 70 rows: tiles of MAX_C_ROWS, each with its gated rows
def test_int8_matrix_steps_with_the_gated_delta_in_c(n):
    """normed, add_to and add_silu_to with a gate: the C delta at the mask rows equals the tensor ops' (to
    rounding), and the real rows are exactly the bare int8 matrix's (no delta at all)."""
    from mars.runtime.fastpath import Gate

    is_mask = torch.zeros(1, n, dtype=torch.bool)
    is_mask[0, 1:4] = True
    is_mask[0, -1] = True
    gate = Gate(is_mask, torch.float32)
    real = ~is_mask[0]
    for shapes, ranks, step in (([(40, 64), (24, 64)], [8, 8], "normed"), ([(64, 64)], [16], "add_to"),
                                ([(64, 32)], [16], "add_silu_to")):
        mods = fused_linear(shapes, bias=True)
        lora = gated_lora(shapes[0][1], [o for o, _ in shapes], ranks, seed=n)
        c, bare, plain = Int8Linear(mods, lora), Int8Linear(mods), Int8Linear(mods, lora)
        plain.lora_c = None  # the delta by the tensor ops, after the same C product
        assert c.lora_c is not None
        x = rows(n, 64, seed=2)[None]
        res = torch.randn(1, n, c.out_features, generator=torch.Generator().manual_seed(5))
        args = {"normed": lambda m, gt: m.normed(x, torch.ones(64) * 0.7, 1e-6, gt),
                "add_to": lambda m, gt: m.add_to(res, x, gt),
                "add_silu_to": lambda m, gt: m.add_silu_to(res, x, gt)}[step]
        got, want, base = args(c, gate), args(plain, gate), args(bare, None)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4, msg=step)
        assert torch.equal(got[0, real], base[0, real]), step
        assert not torch.allclose(got[0, ~real], base[0, ~real]), step  # the delta is there


@needs_c
@pytest.mark.skipif(lib is not None and not lib.amx, reason="no AMX tiles on this CPU")
def test_amx_product_equals_the_vnni_product():
    """AMX tiles (up to 16 tokens' rows in one instruction) and the VNNI loop compute the same integers."""
    g = torch.Generator().manual_seed(7)
    q, sw = quantize_weight(torch.randn(80, 576, generator=g))
    blocked, wsum = ck.block_weights(lib, q)
    for n in (1, 5, 16, 17, 32, 40):  # 17 and 32 rows: a second row tile; 40: more than AMX's two
        x = rows(n, 576, seed=n)
        xq = ck.quant_rows(lib, x, 576)
        args = (ctypes.byref(xq.c), blocked.data_ptr(), wsum.data_ptr(), 80, 576, sw.data_ptr(), None, None, 0)
        a, v = torch.empty(n, 80), torch.empty(n, 80)
        lib.mars_gemv_amx(*args, a.data_ptr(), 80, None, 0, None, 0, None)
        lib.mars_gemv_rows(*args, v.data_ptr(), 80, None, 0, None, 0, None)
        assert torch.equal(a, v), n


@needs_c
@pytest.mark.parametrize("amx", [False, True])
def test_c_product_with_the_delta_in_the_same_call_equals_the_delta_after_it(amx, monkeypatch):
    """gemv_rows with a delta (each block of outputs gets B t as it is finished) gives the same bits as the
    product then `lora_rows`: one call and one thread team instead of two."""
    if amx and not lib.amx:
        pytest.skip("no AMX tiles on this CPU")
    monkeypatch.setattr(lib, "amx", amx)
    g = torch.Generator().manual_seed(11)
    outs, k = [40, 24, 36], 96  # 36: a segment that ends inside a block of outputs
    q, sw = quantize_weight(torch.randn(sum(outs), k, generator=g))
    blocked, wsum = ck.block_weights(lib, q)
    lw = ck.LoraWeights.of(*gated_lora(k, outs, [16, 0, 8], seed=3), outs)
    for n, gated in ((1, [0]), (5, [1, 2, 3]), (16, list(range(2, 16))), (40, list(range(3, 40, 2)))):
        x = rows(n, k, seed=n)
        xq = ck.quant_rows(lib, x, ck.padded(k))
        res = torch.randn(n, sum(outs), generator=g)
        idx = torch.tensor(gated)
        fused = ck.gemv_rows(lib, xq, blocked, wsum, sw, None, res, (x, idx, lw))
        after = ck.lora_rows(lib, x, idx, lw, ck.gemv_rows(lib, xq, blocked, wsum, sw, None, res))
        assert torch.equal(fused, after), n


@needs_c
def test_greedy_choice_and_its_probability_in_c_equal_the_tensor_ops():
    """argmax_conf: torch's argmax (the first of tied maxima) and softmax's probability of it, to rounding, for
    any leading shape and row stride; choose_and_score takes it for greedy "prob" on a CPU."""
    from mars.decoding.acceptance import choose_and_score

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 49152 + 7, generator=g) * 4  # a length past the vector width
    x[0, 1, 100] = x[0, 1, 40000] = 60.0  # a tie: the first one
    x[1, 2] = 0.0  # a flat row: index 0, probability 1 / V
    x[1, 3, -1] = 50.0  # the maximum in the scalar tail
    tok, conf = ck.argmax_conf(x)
    assert tok.shape == conf.shape == (2, 5)
    assert torch.equal(tok, x.argmax(-1)) and tok[0, 1] == 100 and tok[1, 2] == 0 and tok[1, 3] == x.shape[-1] - 1
    ref = torch.softmax(x.double(), -1).gather(-1, tok[..., None])[..., 0].float()
    torch.testing.assert_close(conf, ref, rtol=1e-5, atol=1e-9)
    strided = x[:, ::2]  # rows not one after another
    assert all(torch.equal(a, b) for a, b in zip(ck.argmax_conf(strided), (tok[:, ::2], conf[:, ::2])))
    t2, c2 = choose_and_score(x, "prob", scoring=C_SCORING)  # the backends pass the C scoring in
    assert torch.equal(t2, tok) and torch.equal(c2, conf)
    assert ck.argmax_conf(x.double()) is None  # the tensor ops then
    t3, c3 = choose_and_score(x.double(), "prob")
    assert torch.equal(t3, tok)
    torch.testing.assert_close(c3.float(), conf, rtol=1e-5, atol=1e-9)


@needs_c
def test_top_candidates_in_c_equal_softmax_then_topk():
    """top_probs: the k likeliest tokens (earlier index first among equal values) and their softmax
    probabilities, as softmax + topk give them; acceptance.top_probs takes it on a CPU, the tensor ops elsewhere."""
    from mars.decoding.acceptance import top_probs

    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 4, 49152 + 5, generator=g) * 4
    x[0, 0, [7, 9000, 20000]] = 40.0  # tied at the top: 7, 9000, 20000 in that order
    x[1, 1, -2:] = 45.0  # the best two in the scalar tail
    prob, idx = ck.top_probs(x, 5)
    assert prob.shape == idx.shape == (3, 4, 5)
    assert idx[0, 0, :3].tolist() == [7, 9000, 20000] and idx[1, 1, :2].tolist() == [x.shape[-1] - 2, x.shape[-1] - 1]
    ref = torch.softmax(x.double(), -1)
    torch.testing.assert_close(prob, ref.gather(-1, idx).float(), rtol=1e-5, atol=1e-9)
    top = torch.softmax(x, -1).topk(5, -1)
    assert torch.equal(idx[1:], top.indices[1:]) and torch.equal(idx[0, 1:], top.indices[0, 1:])  # no ties there
    assert (prob[..., :-1] >= prob[..., 1:]).all()
    p2, i2 = top_probs(x, 5, C_SCORING)
    assert torch.equal(p2, prob) and torch.equal(i2, idx)
    assert ck.top_probs(x.double(), 5) is None
    p3, i3 = top_probs(x[1:].double(), 5)  # the tensor ops
    assert torch.equal(i3, idx[1:])
    torch.testing.assert_close(p3.float(), prob[1:], rtol=1e-5, atol=1e-9)
