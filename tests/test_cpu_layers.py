"""The int8 fast path's attention and layer loop in C (mars/runtime/cpu_layers.py, source mars/runtime/csrc/layers.c):
attention against rotary + softmax in float64, a row's result independent of the rest of its pass (the
lossless modes compare a row with itself in a 1-token pass), the whole-pass C loop equal to the per-layer
path bit for bit (gated adapter included), and the switch back to the tensor ops."""

import json
import math

import pytest
import torch

import tiny
from mars.runtime import kernels as ck
from mars.runtime.cpu_layers import attend
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.runtime.fastpath import FastLM

lib = ck.kernels()
needs_c = pytest.mark.needs_c  # skips without a compiler, fails on a failed build (conftest.py)


def rope_rows(n, hd, seed):
    """cos, sin tables (n, hd) as FastLM.rope_table lays them out (sin's first half negated)."""
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(n, hd // 2, generator=g, dtype=torch.float64) * 6
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([-ang.sin(), ang.sin()], -1)
    return cos.float().contiguous(), sin.float().contiguous()


def case(b, W, C, H, KV, hd, cap, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, W, (H + 2 * KV) * hd, generator=g)
    k = torch.randn(b, KV, cap, hd, generator=g)
    v = torch.randn(b, KV, cap, hd, generator=g)
    allowed = torch.ones(b, W, C + W, dtype=torch.bool)
    allowed[:, :, C:] = torch.ones(W, W, dtype=torch.bool).tril()
    allowed[:, :, : C // 3] &= torch.rand(b, 1, C // 3, generator=g) > 0.3  # padding / dropped drafts
    allowed[0, -1, :C] = False  # a row that sees only the window
    return qkv, k, v, allowed


def reference(qkv, cos, sin, k, v, C, allowed, H, KV):
    """The obvious float64 computation: rotate q and k, write k and v, softmax over the allowed keys."""
    b, W, _ = qkv.shape
    hd = k.shape[-1]
    x = qkv.double().view(b, W, H + 2 * KV, hd)
    c, s = cos.double().view(b, W, 1, hd), sin.double().view(b, W, 1, hd)
    rot = x[:, :, : H + KV] * c + x[:, :, : H + KV].roll(hd // 2, dims=-1) * s
    q, kw, vw = rot[:, :, :H], rot[:, :, H:], x[:, :, H + KV:]
    keys = k.double().clone()
    vals = v.double().clone()
    keys[:, :, C:C + W] = kw.transpose(1, 2)
    vals[:, :, C:C + W] = vw.transpose(1, 2)
    keys = keys[:, :, : C + W].repeat_interleave(H // KV, 1)
    vals = vals[:, :, : C + W].repeat_interleave(H // KV, 1)
    scores = torch.einsum("bwhd,bhtd->bhwt", q, keys) / math.sqrt(hd)
    scores = scores.masked_fill(~allowed[:, None], -math.inf)
    out = torch.einsum("bhwt,bhtd->bwhd", scores.softmax(-1), vals)
    return out.reshape(b, W, H * hd), keys, vals


@needs_c
@pytest.mark.parametrize("b,W,C,H,KV,hd", [(1, 1, 37, 9, 3, 64), (2, 5, 40, 9, 3, 64), (1, 7, 16, 4, 2, 16),
                                            (3, 3, 33, 4, 4, 32), (1, 2, 0, 2, 1, 24)])
def test_c_attention_equals_rotary_and_softmax_in_float64(b, W, C, H, KV, hd):
    qkv, k, v, allowed = case(b, W, C, H, KV, hd, cap=C + W + 5)
    cos, sin = rope_rows(b * W, hd, seed=1)
    want, keys, vals = reference(qkv, cos, sin, k, v, C, allowed, H, KV)
    k0, v0 = k.clone(), v.clone()
    got = attend(lib, qkv, cos, sin, k, v, C, allowed.to(torch.uint8), H, KV)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k[:, :, : C + W].double(), keys[:, :: H // KV], rtol=1e-6, atol=1e-6)
    assert torch.equal(v[:, :, C:C + W], qkv.view(b, W, H + 2 * KV, hd)[:, :, H + KV:].transpose(1, 2))
    assert torch.equal(k[:, :, :C], k0[:, :, :C]) and torch.equal(v[:, :, C + W:], v0[:, :, C + W:])  # the rest


@needs_c
@pytest.mark.parametrize("hd", [64, 16, 40])
def test_a_rows_attention_does_not_depend_on_its_pass(hd):
    """A W-row pass against the same rows fed one at a time (each then sees only what it was allowed to): every
    row's output and every written key, bit for bit: masked and trailing keys add exact zeros."""
    b, W, C, H, KV = 2, 6, 45, 9, 3
    qkv, k, v, allowed = case(b, W, C, H, KV, hd, cap=C + W, seed=3)
    allowed[0, -1, :C] = True
    cos, sin = rope_rows(b * W, hd, seed=4)
    k1, v1 = k.clone(), v.clone()
    wide = attend(lib, qkv.clone(), cos, sin, k, v, C, allowed.to(torch.uint8), H, KV)
    cos, sin = cos.view(b, W, hd), sin.view(b, W, hd)
    for i in range(W):
        one = attend(lib, qkv[:, i:i + 1].clone(), cos[:, i].contiguous(), sin[:, i].contiguous(), k1, v1, C + i,
                     allowed[:, i:i + 1, : C + i + 1].to(torch.uint8).contiguous(), H, KV)
        assert torch.equal(one[:, 0], wide[:, i]), i
    assert torch.equal(k1, k) and torch.equal(v1, v)


@needs_c
@pytest.mark.parametrize("hd", [64, 16])
def test_a_rows_attention_depends_only_on_its_allowed_keys_in_order(hd):
    """The same query and the same allowed keys, once side by side and once scattered among masked columns of
    other values (a padded batch row, a tree node whose ancestors sit apart): the same bits."""
    H, KV, n = 4, 2, 37
    g = torch.Generator().manual_seed(7)
    keys, vals = torch.randn(1, KV, n, hd, generator=g), torch.randn(1, KV, n, hd, generator=g)
    qkv = torch.randn(1, 1, (H + 2 * KV) * hd, generator=g)
    cos, sin = rope_rows(1, hd, seed=8)
    outs = []
    for spread in (0, 1, 2):
        at = torch.sort(torch.randperm(n + 40, generator=g)[:n]).values if spread else torch.arange(n)
        C = int(at[-1]) + 1 if spread else n
        k = torch.randn(1, KV, C + 1, hd, generator=g) * 9  # other keys everywhere, then ours at `at`
        v = torch.randn(1, KV, C + 1, hd, generator=g) * 9
        k[:, :, at], v[:, :, at] = keys, vals
        allowed = torch.zeros(1, 1, C + 1, dtype=torch.uint8)
        allowed[0, 0, at] = 1
        allowed[0, 0, C] = 1  # the row's own key
        outs.append(attend(lib, qkv.clone(), cos, sin, k, v, C, allowed, H, KV))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.fixture(scope="module")
def plain_lib(tmp_path_factory):
    """The kernels built without AVX (-mno-avx takes AVX2, FMA and AVX-512 with it): the plain C loops, which
    every build's attention equals bit for bit."""
    got = ck.build(out_dir=tmp_path_factory.mktemp("plain"), extra_flags=["-mno-avx"])
    assert got.lib is not None, got.why
    assert got.lib.mars_isa() == ck.HEADER.constants["MARS_ISA_PLAIN"]
    return got.lib


@needs_c
@pytest.mark.parametrize("b,W,C,H,KV,hd", [(1, 1, 0, 2, 1, 64),  # one key
                                            (1, 1, 100, 9, 3, 64), (1, 5, 100, 9, 3, 64), (2, 16, 37, 9, 3, 64),
                                            (1, 64, 131, 9, 3, 64), (1, 64, 250, 9, 3, 64), (2, 32, 70, 9, 3, 64),
                                            (2, 9, 21, 4, 2, 16), (1, 13, 50, 6, 2, 32),
                                            (1, 7, 30, 2, 1, 48), (2, 11, 19, 4, 1, 128), (1, 3, 14, 2, 2, 256),
                                            (1, 6, 23, 2, 1, 40)])  # hd 40: not a multiple of 16 (plain loops)
def test_c_attention_equals_the_plain_c_build_bit_for_bit(plain_lib, b, W, C, H, KV, hd):
    """This CPU's build (AVX2 or AVX-512: keys 8 or 16 at a time, several queries per block of keys) against the
    plain C loops, on key counts that are no multiple of 8 or 16, keys masked inside a block, blocks every row
    of a group may see (no test per key), a row that may see nothing, and queries of many rows and heads at
    once: the same sums in the same order, the same bits."""
    qkv, k, v, allowed = case(b, W, C, H, KV, hd, cap=C + W + 2, seed=W + hd)
    g = torch.Generator().manual_seed(C)
    allowed[:, ::3, :C] &= torch.rand(b, (W + 2) // 3, C, generator=g) > 0.25  # holes anywhere, in every 3rd row
    if W > 3:
        allowed[-1, 2] = False  # a row that sees no key: zeros
    cos, sin = rope_rows(b * W, hd, seed=hd)
    got = []
    for L in (lib, plain_lib):
        kk, vv, x = k.clone(), v.clone(), qkv.clone()
        got.append((attend(L, x, cos, sin, kk, vv, C, allowed.to(torch.uint8), H, KV), kk, vv, x))
    assert all(torch.equal(u, w) for u, w in zip(*got))
    if W > 3:
        assert not got[0][0][-1, 2].any()


@needs_c
@pytest.mark.parametrize("hd", [64, 32])
def test_c_attention_on_a_sparse_mask_equals_the_plain_c_build_bit_for_bit(plain_lib, hd):
    """Rows that see a stretch of the cache and their own group of the window (the acceptance lab's packed
    examples, mars.evaluation.acceptance_lab): blocks of keys that a row may not see at all are skipped, and
    the rest gives the plain C loops' bits."""
    b, W, C, H, KV = 1, 40, 300, 9, 3
    qkv, k, v, _ = case(b, W, C, H, KV, hd, cap=C + W, seed=11)
    g = torch.Generator().manual_seed(12)
    allowed = torch.zeros(b, W, C + W, dtype=torch.bool)
    group = torch.arange(W) // 5
    for i in range(W):
        lo = int(torch.randint(0, C // 2, (1,), generator=g))
        allowed[0, i, lo:lo + int(torch.randint(1, C // 2, (1,), generator=g))] = True
        allowed[0, i, C:C + i + 1] = group[: i + 1] == group[i]
    cos, sin = rope_rows(b * W, hd, seed=13)
    got = [attend(L, qkv.clone(), cos, sin, k.clone(), v.clone(), C, allowed.to(torch.uint8), H, KV)
           for L in (lib, plain_lib)]
    assert torch.equal(got[0], got[1])


@needs_c
def test_c_attention_refuses_shapes_it_cannot_take():
    qkv, k, v, allowed = case(1, 2, 4, 4, 2, 16, cap=8)
    cos, sin = rope_rows(2, 16, seed=0)
    with pytest.raises(ValueError, match="do not fit"):
        attend(lib, qkv, cos, sin, k, v, 7, torch.ones(1, 2, 9, dtype=torch.uint8), 4, 2)  # past the capacity
    with pytest.raises(TypeError, match="uint8"):
        attend(lib, qkv, cos, sin, k, v, 4, allowed, 4, 2)  # a bool mask
    with pytest.raises(ValueError, match="contiguous"):
        strided = torch.stack([qkv, qkv], -1)[..., 0]  # the same values, every other float
        attend(lib, strided, cos, sin, k, v, 4, allowed.to(torch.uint8), 4, 2)


def gated_tiny(tmp_path, tiny_dir):
    """The tiny model in float32 with a random gated adapter whose values are float16's (as the shipped one's,
    which the C kernels take)."""
    from test_gated import random_lora
    from mars.models.loading import load

    peft = random_lora(load(str(tiny_dir), dtype="float32").model)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_" in n:
                p.copy_(p.half().float())
    out = tmp_path / "adapter"
    peft.save_pretrained(out, safe_serialization=True)
    (out / "mars.json").write_text(json.dumps({"gated": True, "block_size": 4, "mask_token": "<|mask|>",
                                               "base_model": str(tiny_dir)}))
    return load(str(tiny_dir), adapter=str(out), dtype="float32")


def passes(f: FastLM, mask_id: int):
    """A prompt, then window passes of 1-7 rows (masks after the first), on one cache."""
    g = torch.Generator().manual_seed(0)
    P = 23
    ids = torch.randint(5, 60, (2, P), generator=g)
    cache = f.new_cache(2, 8)  # grows
    outs = [f.forward(ids, torch.arange(P).expand(2, P), torch.ones(2, P, P, dtype=torch.bool).tril(),
                      torch.arange(P), cache)]
    for W in (1, 4, 7, 2, 19):  # 2 x 19 rows: more than one C call takes, in causal pieces, masks in each
        C = cache.length
        wid = torch.full((2, W), mask_id)
        wid[:, 0] = torch.randint(5, 60, (2,), generator=g)
        allowed = torch.ones(2, W, C + W, dtype=torch.bool)
        allowed[:, :, C:] = torch.ones(W, W, dtype=torch.bool).tril()
        allowed[1, :, :3] = False  # a left-padded row
        outs.append(f.forward(wid, torch.arange(C, C + W).expand(2, W), allowed, torch.arange(W), cache))
    return outs, cache


@needs_c
def test_the_whole_pass_c_loop_equals_the_per_layer_path(tmp_path, tiny_dir, monkeypatch):
    """mars_layers (passes of up to MAX_C_ROWS rows in one call; longer causal ones in pieces, the gated rows
    mapped into each) against the per-layer path (matrices from Python in tiles of MAX_C_ROWS rows, the C
    attention): the same kernels in the same order, so the same logits and cache, bare and gated."""
    lm = gated_tiny(tmp_path, tiny_dir)
    f = FastLM(lm.model, torch.int8)
    assert f.c_layers is not None and f.gated is not None
    calls, real = [], f.c_layers.layers

    def spy(x, *args):
        calls.append(x.shape[0] * x.shape[1])
        return real(x, *args)

    monkeypatch.setattr(f.c_layers, "layers", spy)
    whole, c1 = passes(f, lm.mask_token_id)
    assert calls == [46, 2, 8, 14, 4, 38]  # every pass in one call (at most MAX_C_ROWS = 64 rows)
    calls.clear()
    monkeypatch.setattr(f.c_layers, "max_rows", 16)
    pieces, c3 = passes(f, lm.mask_token_id)
    # the 2 x 23 prompt and the 2 x 19 pass ran as causal pieces of 8 columns, the rest whole
    assert calls == [16, 16, 14, 2, 8, 14, 4, 16, 16, 6]
    monkeypatch.setattr(f.c_layers, "max_rows", 0)  # every pass layer by layer
    split, c2 = passes(f, lm.mask_token_id)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(whole, split, pieces))
    n = c1.length
    for c in (c2, c3):
        assert torch.equal(c1.k[:, :, :, :n], c.k[:, :, :, :n]) and torch.equal(c1.v[:, :, :, :n], c.v[:, :, :, :n])


@needs_c
def test_the_c_layers_can_be_switched_off_and_agree_with_the_tensor_ops(env):
    lm = tiny.make_loaded("qwen2", seed=4, dtype=torch.float32)  # q, k, v biases
    # nearest rounding: with the error-feedback weights one row of this random model sits at an 8-bit rounding
    # tie that SDPA's sum order moves (rel. 2e-3); the weights are the same either way (tests/test_rounding.py)
    c = FastLM(lm.model, torch.int8, calibrate=False)
    env.set("MARS_C_LAYERS", "0")
    t = FastLM(lm.model, torch.int8, calibrate=False)
    assert c.c_layers is not None and t.c_layers is None
    for a, b in zip(passes(c, lm.mask_token_id)[0], passes(t, lm.mask_token_id)[0]):
        # SDPA sums in another order, and a last-bit change can move an 8-bit rounding of the next matrix's rows
        assert (a - b).norm() / b.norm() < 1e-4


@needs_c
def test_lossless_modes_on_the_c_layers_equal_int8_greedy():
    """The gated-free tiny model in float32 on the C layers: MARS at tau 1 and the verified modes give the int8
    model's own greedy tokens, a batch as its rows alone."""
    lm = tiny.make_loaded("llama", seed=4, dtype=torch.float32)
    assert FastLM(lm.model, torch.int8).c_layers is not None
    prompts = ["what is the capital of france ?", "tell me a word", "write a long sentence about the water"]
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    kw = dict(max_new_tokens=24, backend="fast-int8", cache_block=8)
    ar = [generate_ids(lm, [i], DecodeConfig(mode="ar", **kw))[0].token_ids for i in ids]
    for cfg in (DecodeConfig(mode="mars", tau=1.0, block_size=4, **kw),
                DecodeConfig(mode="verified", tau=0.0, block_size=4, drafts="both", **kw),
                DecodeConfig(mode="verified", tau=0.0, block_size=8, **kw)):
        assert [r.token_ids for r in generate_ids(lm, ids, cfg)] == ar, cfg.mode


def padded_pass(f: FastLM, mask_id: int, skip: bool):
    """A 3-row prompt pass, then a pass of right-aligned windows of 5, 2 and 0 inputs (a real token, then masks)
    as the decoder lays a batch out, reading the last 2 columns; `skip`: with its padding named."""
    from mars.decoding.masks import pass_mask

    g = torch.Generator().manual_seed(0)
    P, W, lens = 9, 5, [5, 2, 0]
    cache = f.new_cache(3, 32)
    f.forward(torch.randint(5, 60, (3, P), generator=g), torch.arange(P).expand(3, P),
              torch.ones(3, P, P, dtype=torch.bool).tril(), torch.arange(P), cache)
    starts = torch.tensor([W - n for n in lens])
    pad = torch.arange(W)[None] < starts[:, None]  # (3, W)
    ids = torch.full((3, W), mask_id)
    local = torch.zeros(3, W, W, dtype=torch.bool)
    for r, n in enumerate(lens):
        if n:
            ids[r, W - n] = int(torch.randint(5, 60, (1,), generator=g))
            local[r, W - n:, W - n:] = torch.ones(n, n, dtype=torch.bool).tril()
    pos = (P + torch.arange(W)[None] - starts[:, None]).clamp(min=0)
    allowed = pass_mask(torch.ones(3, P, dtype=torch.bool), local)
    out = f.forward(ids, pos, allowed, torch.tensor([3, 4]), cache, pad if skip else None)
    return out, cache, pad


@needs_c
def test_a_batch_pass_computes_only_what_is_read_with_the_same_bits(tmp_path, tiny_dir, monkeypatch):
    """FastLM.forward with `padding`: the C layers run only the inputs someone reads, in one call, and give each of
    them (its logits, its KV) the bits of the whole pass; the padding's logits are zeros."""
    lm = gated_tiny(tmp_path, tiny_dir)
    f = FastLM(lm.model, torch.int8)
    calls, real = [], f.c_layers.layers

    def spy(x, *args):
        calls.append(x.shape[0] if x.dim() == 2 else x.shape[0] * x.shape[1])  # rows computed
        return real(x, *args)

    monkeypatch.setattr(f.c_layers, "layers", spy)
    a, ca, pad = padded_pass(f, lm.mask_token_id, skip=True)
    b, cb, _ = padded_pass(f, lm.mask_token_id, skip=False)
    assert calls == [27, 7, 27, 15]  # the second pass: 5 + 2 + 0 rows, not 3 x 5
    read = ~pad[:, 3:]  # (3, 2): the kept columns that are not padding
    assert torch.equal(a[read], b[read]) and bool((a[~read] == 0).all())
    assert not bool((b[~read] == 0).all())  # computed in full, the padding's logits are something else
    for r in range(3):
        cols = [c for c in range(9 + 5) if c < 9 or not pad[r, c - 9]]
        assert torch.equal(ca.k[:, r, :, cols], cb.k[:, r, :, cols]) and torch.equal(ca.v[:, r, :, cols], cb.v[:, r, :, cols])


@needs_c
def test_an_int8_batch_on_the_c_layers_equals_each_row_alone(monkeypatch):
    """MARS at tau 0.3 on the C layers: rows accept different counts, so a batch's windows have padding (skipped)
    and its cache holes; every row's tokens and passes are still those of the row alone."""
    skipped, real = [], FastLM._c_forward_rows

    def spy(self, x, *args):
        skipped.append(x.shape[0] * x.shape[1] - args[-2].numel())
        return real(self, x, *args)

    monkeypatch.setattr(FastLM, "_c_forward_rows", spy)
    lm = tiny.make_loaded("llama", seed=4, dtype=torch.float32)
    prompts = ["what is the capital of france ?", "tell me a word", "write a long sentence about the water", "add 2"]
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    cfg = DecodeConfig(mode="mars", tau=0.3, block_size=4, max_new_tokens=24, backend="fast-int8", cache_block=8)
    batch = generate_ids(lm, ids, cfg)
    assert len({tuple(len(s.token_ids) for s in r.steps) for r in batch}) > 1  # the rows took different steps
    assert len(skipped) > 3 and all(n > 0 for n in skipped)  # passes with padding, not computed
    for p, res in zip(ids, batch):
        alone = generate_ids(lm, [p], cfg)[0]
        assert res.token_ids == alone.token_ids and res.passes == alone.passes
