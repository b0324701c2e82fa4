"""The fast path (mars/runtime/fastpath.py) against transformers' own forward, and the decoder on both backends."""

from types import SimpleNamespace

import pytest
import torch

import tiny
from mars.runtime.backends import FastBackend, HFBackend, resolve_backend
from mars.runtime import cpu
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.runtime.fastpath import KVCache, fast_model, unsupported_reason

PROMPTS = ["what is the capital of france ?", "tell me a word", "write a long sentence about the water and the earth"]
DEFAULT_PROMPTS = ["What is the capital of France?", "List three fruits.", "Explain why the sky is blue."]


def _scenario(backend, prompts: list[list[int]], mask_id: int, pad_id: int) -> list[torch.Tensor]:
    """Drive a backend the way the decoder does; return the logits of every pass.

    A left-padded prefill, then MARS-like windows (uncached real tokens + masks) of changing widths with
    varying commits (truncate), a row leaving the batch (select), and a window that is not causal.
    """
    b, P = len(prompts), max(len(p) for p in prompts)
    pads = [P - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * d + p for d, p in zip(pads, prompts)])
    pos = torch.tensor([[max(0, c - d) for c in range(P)] for d in pads])
    key_ok = torch.tensor([[c >= d for c in range(P)] for d in pads])  # (b, P): padding is never a key
    allowed = torch.tril(torch.ones(P, P, dtype=torch.bool))[None] & key_ok[:, None, :]
    allowed[:, torch.arange(P), torch.arange(P)] = True  # padding queries see themselves
    out = [backend.forward(ids, pos, allowed, [P - 1])]
    g = torch.Generator().manual_seed(0)
    C, nxt = P, [P - d for d in pads]  # cached columns; next position id per row
    for step, (real, masks, commit) in enumerate([(1, 3, 1), (2, 3, 2), (1, 7, 0), (1, 3, 1), (3, 0, 3)]):
        W = real + masks
        if step == 3:  # a row leaves the batch
            backend.select([0, 2])
            key_ok, nxt, b = key_ok[[0, 2]], [nxt[0], nxt[2]], 2
        win = torch.cat([torch.randint(5, 40, (b, real), generator=g), torch.full((b, masks), mask_id)], dim=1)
        wpos = torch.tensor([[n + i for i in range(W)] for n in nxt])
        local = torch.tril(torch.ones(W, W, dtype=torch.bool))
        if masks > 2:
            local[real + 1, real] = False  # not causal: a mask that does not see the mask before it
        allowed = torch.cat([key_ok[:, None, :].expand(b, W, C), local[None].expand(b, W, W)], dim=2)
        out.append(backend.forward(win, wpos, allowed, list(range(W))))
        backend.truncate(C + commit)
        key_ok = torch.cat([key_ok, torch.ones(b, commit, dtype=torch.bool)], dim=1)
        C, nxt = C + commit, [n + commit for n in nxt]
        assert backend.length == C
    return out


def _compare(lm, rtol, atol, **fast_kw):
    enc = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]  # different lengths: real left padding
    assert len({len(e) for e in enc}) == len(enc)
    args = (enc, lm.mask_token_id, lm.tokenizer.pad_token_id or 0)
    ref = _scenario(HFBackend(lm.model), *args)
    fast = _scenario(FastBackend(fast_model(lm.model, **fast_kw), len(enc), capacity=8), *args)  # capacity 8: grows
    assert len(ref) == len(fast)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    return fast, ref


@pytest.mark.parametrize("layout", ["auto", "linear", "packed"])
def test_fast_logits_equal_hf_tiny_float64(tiny_lm, tiny_qwen, layout):
    for lm in (tiny_lm, tiny_qwen):  # Llama, and Qwen2 (q/k/v biases)
        _compare(lm, rtol=1e-9, atol=1e-9, layout=layout)


@pytest.mark.parametrize("layout", ["auto", "packed"])
def test_fast_logits_equal_hf_tiny_float32(layout):
    lm = tiny.make_loaded("qwen2", seed=3, dtype=torch.float32)  # float32: the packed oneDNN matrices run
    _compare(lm, rtol=1e-5, atol=1e-5, layout=layout)


def test_fast_logits_equal_hf_default_model(default_lm):
    _compare(default_lm, rtol=1e-4, atol=1e-4)


def test_bf16_weights_are_close_not_exact():
    """Where this CPU runs oneDNN bfloat16: close, not exact. Where it does not (AVX2 only): a clear refusal."""
    lm = tiny.make_loaded("llama", dtype=torch.float32)
    reason = cpu.bf16_unsupported_reason()
    if reason is not None:
        with pytest.raises(ValueError, match="AVX-512"):
            _compare(lm, rtol=1.0, atol=1.0, weight_dtype=torch.bfloat16)
        return
    fast, ref = _compare(lm, rtol=1.0, atol=1.0, weight_dtype=torch.bfloat16)
    err = max((a - b).abs().max().item() for a, b in zip(fast, ref))
    assert 0 < err < 0.2  # bfloat16 matrices change the numerics: opt-in only


AVX2_ONLY = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}  # e.g. an AMD EPYC before Zen 4


def test_cpu_flags_can_be_forced_for_an_avx2_only_run(env):
    env.set("MARS_CPU_FLAGS", "avx, avx2 fma")
    assert cpu.cpu_flags() == {"avx", "avx2", "fma"}
    assert "AVX2 only" in cpu.bf16_unsupported_reason()
    env.set("MARS_CPU_FLAGS", "")
    assert cpu.cpu_flags() != {"avx", "avx2", "fma"}  # unset: this machine's own (a real CPU lists far more)


def test_bf16_support_follows_the_cpu_flags():
    assert cpu.bf16_unsupported_reason(AVX2_ONLY | {"avx512f"}) is not None  # avx512f alone is not enough
    assert "fast" in cpu.bf16_unsupported_reason(AVX2_ONLY)  # the message names what to use instead
    assert cpu.bf16_unsupported_reason(AVX2_ONLY | {"avx512bw", "avx512vl", "avx512dq"}) is None
    assert cpu.bf16_unsupported_reason(AVX2_ONLY | {"avx_ne_convert"}) is None


def test_fast_bf16_is_refused_on_an_avx2_only_cpu(env):
    """The refusal path, exercised on any machine by pretending the CPU has AVX2 only."""
    env.set("MARS_CPU_FLAGS", " ".join(sorted(AVX2_ONLY)))
    lm = tiny.make_loaded("llama", seed=7, dtype=torch.float32)
    ids = [encode_prompt(lm.tokenizer, PROMPTS[0])]
    with pytest.raises(ValueError, match="use backend 'fast'"):
        generate_ids(lm, ids, DecodeConfig(mode="ar", max_new_tokens=4, backend="fast-bf16"))
    # the exact backends are untouched by the CPU's bfloat16 support
    fast = generate_ids(lm, ids, DecodeConfig(mode="ar", max_new_tokens=4, backend="fast"))[0]
    assert 1 <= len(fast.token_ids) <= 4


def test_kv_cache_truncate_select_reserve():
    c = KVCache(layers=2, batch=3, kv_heads=1, head_dim=2, capacity=2, dtype=torch.float64)
    c.k[:, :, :, :2] = torch.arange(3.0)[None, :, None, None, None]
    c.length = 2
    c.reserve(5)
    assert c.capacity >= 5 and c.length == 2
    assert c.k[:, :, :, :2].eq(torch.arange(3.0)[None, :, None, None, None]).all()  # kept across growth
    c.select([2, 0])
    assert c.batch == 2 and c.k[0, :, 0, 0, 0].tolist() == [2.0, 0.0]
    c.truncate(1)
    assert c.length == 1
    with pytest.raises(ValueError):
        c.truncate(2)  # cannot grow by truncating


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_gather_keeps_the_named_columns_in_their_new_order(tiny_lm, backend):
    """gather(cols): the cache then holds exactly the old columns `cols`, in that order, and nothing else."""
    from mars.runtime.backends import make_backend

    runner = make_backend(tiny_lm.model, backend, 1, 4)
    n = 7
    runner.forward(torch.arange(3, 3 + n)[None], torch.arange(n)[None], torch.ones(1, n, n, dtype=torch.bool).tril(), [n - 1])

    def kv():
        if backend == "fast":
            return runner.cache.k[:, :, :, :runner.length].clone(), runner.cache.v[:, :, :, :runner.length].clone()
        return (torch.stack([la.keys for la in runner.cache.layers]), torch.stack([la.values for la in runner.cache.layers]))

    k0, v0 = kv()
    cols = [5, 1, 2, 6]
    runner.gather(cols)
    k1, v1 = kv()
    assert runner.length == len(cols)
    assert torch.equal(k1, k0[..., cols, :]) and torch.equal(v1, v0[..., cols, :])
    with pytest.raises(ValueError, match="columns"):
        runner.gather([4])  # past the 4 columns left


@pytest.mark.parametrize("mode,tau,B", [("ar", 1.0, 4), ("mars", 1.0, 4), ("mars", 0.5, 4), ("mars", 0.0, 3),
                                        ("verified", 0.0, 4), ("jacobi", 0.0, 4)])
def test_fast_and_hf_backends_decode_the_same_tokens_tiny(tiny_lm, mode, tau, B):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]
    kw = dict(mode=mode, tau=tau, block_size=B, max_new_tokens=30, cache_block=8)
    for batch in ([ids[0]], ids):  # alone, and a left-padded batch
        fast = generate_ids(tiny_lm, batch, DecodeConfig(**kw, backend="fast"))
        hf = generate_ids(tiny_lm, batch, DecodeConfig(**kw, backend="hf"))
        assert [r.token_ids for r in fast] == [r.token_ids for r in hf]
        assert [r.passes for r in fast] == [r.passes for r in hf]


def test_hf_backend_still_equals_hf_generate(tiny_lm):
    """The reference path keeps its own check: tau = 1 == AR == transformers' greedy generate."""
    for p in PROMPTS:
        ids = encode_prompt(tiny_lm.tokenizer, p)
        x = torch.tensor([ids])
        ref = tiny_lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, do_sample=False)
        ref = ref[0, len(ids):].tolist()
        for cfg in (dict(mode="ar"), dict(mode="mars", tau=1.0), dict(mode="ar", use_cache=False)):
            res = generate_ids(tiny_lm, [ids], DecodeConfig(**cfg, max_new_tokens=30, backend="hf"))[0]
            assert res.token_ids == ref


def test_fast_and_hf_backends_decode_the_same_tokens_default_model(default_lm):
    ids = [encode_prompt(default_lm.tokenizer, p) for p in DEFAULT_PROMPTS]
    for mode, tau in (("ar", 1.0), ("mars", 0.5), ("verified", 0.0)):
        kw = dict(mode=mode, tau=tau, max_new_tokens=24, cache_block=8)
        fast = generate_ids(default_lm, ids, DecodeConfig(**kw, backend="fast"))
        hf = generate_ids(default_lm, ids, DecodeConfig(**kw, backend="hf"))
        assert [r.token_ids for r in fast] == [r.token_ids for r in hf]


def test_backend_choice_and_unsupported_models(tiny_lm):
    assert resolve_backend(tiny_lm.model, "auto") == "fast"
    assert resolve_backend(tiny_lm.model, "hf") == "hf"
    other = SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))
    assert "gpt2" in unsupported_reason(other)
    with pytest.raises(ValueError, match="gpt2"):
        resolve_backend(other, "fast")
    with pytest.raises(ValueError):
        DecodeConfig(backend="turbo")


def test_fast_model_is_built_once_and_rebuilt_when_weights_change():
    lm = tiny.make_loaded("llama", seed=5)
    a = fast_model(lm.model)
    assert fast_model(lm.model) is a
    with torch.no_grad():
        lm.model.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # e.g. an optimizer step or an adapter merge
    b = fast_model(lm.model)
    assert b is not a
    _compare(lm, rtol=1e-9, atol=1e-9)  # and the rebuilt path follows the new weights


def test_unmerged_adapters_run_on_transformers():
    peft = pytest.importorskip("peft")
    lm = tiny.make_loaded("llama", seed=6)
    wrapped = peft.get_peft_model(lm.model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert unsupported_reason(wrapped) is not None  # LoRA layers: the fast path would ignore them
    assert resolve_backend(wrapped, "auto") == "hf"
    assert unsupported_reason(wrapped.base_model.model) is not None
