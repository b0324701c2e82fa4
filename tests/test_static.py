"""The fixed-shape path (mars/runtime/static.py) on the CPU: the same tokens as the fast and transformers paths,
a step that compiles without graph breaks at every bucket, and a bounded number of shapes.

On a GPU the same step is replayed as CUDA graphs; nothing here needs one (the CPU runs it without graphs)."""

import pytest
import torch

import tiny
from mars.decoding.acceptance import _in_one_copy, to_host
from mars.runtime.backends import HFBackend, resolve_backend
from mars.decoding.decoder import DecodeConfig, decode_steps, encode_prompt, generate_ids
from mars.runtime.static import BATCHES, WIDTHS, StaticBackend, StaticLM, bucket, round_capacity, static_model
from test_fastpath import PROMPTS, _scenario

CONFIGS = [dict(mode="ar"), dict(mode="mars", tau=1.0), dict(mode="mars", tau=0.7), dict(mode="mars", tau=0.0, block_size=3),
           dict(mode="verified", tau=0.0), dict(mode="verified", tau=0.0, verify_groups="last"),
           dict(mode="verified", tau=0.0, drafts="both"), dict(mode="verified", tau=0.5, drafts="both", verify_groups="last"),
           dict(mode="jacobi", tau=0.0)]


def _ids(lm):
    return [encode_prompt(lm.tokenizer, p) for p in PROMPTS]


def _same(lm, batch, kw, other="fast", slm=None):
    kw = dict(dict(max_new_tokens=30, cache_block=8), **kw)
    a = generate_ids(lm, batch, DecodeConfig(**kw, backend="static"), backend=_on(slm) if slm else None)
    b = generate_ids(lm, batch, DecodeConfig(**kw, backend=other))
    assert [r.token_ids for r in a] == [r.token_ids for r in b], kw
    assert [r.passes for r in a] == [r.passes for r in b], kw
    return a


def _on(slm):
    """The decoder's backend: the static path on this StaticLM (a test's own, to count its shapes only)."""
    return lambda model, cfg, batch, capacity: StaticBackend(model, batch, capacity, slm)


def test_buckets_and_capacity():
    assert [bucket(n, WIDTHS) for n in (1, 2, 3, 5, 8, 9, 64)] == [1, 2, 4, 8, 8, 16, 64]
    assert bucket(65, WIDTHS) is None  # wider passes (a long prefill) run at their own width
    assert round_capacity(1) == 256 and round_capacity(257) == 512


def test_static_logits_equal_hf_float64(tiny_lm, tiny_qwen):
    """The backend driven as the decoder drives it (prefill, windows, commits, a row leaving, a cache that
    outgrows its first buffers) gives transformers' logits."""
    for lm in (tiny_lm, tiny_qwen):
        enc = _ids(lm)
        args = (enc, lm.mask_token_id, lm.tokenizer.pad_token_id or 0)
        ref = _scenario(HFBackend(lm.model), *args)
        be = StaticBackend(lm.model, len(enc), capacity=8)
        # capacity 8 rounds up to 256: shrink it to make the cache grow mid-scenario
        be.state = be.slm.acquire(be.state.batch, 16)
        got = _scenario(be, *args)
        assert be.state.capacity > 16  # it grew
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_static_decodes_the_fast_paths_tokens_float64(tiny_lm, tiny_qwen, kw):
    for lm in (tiny_lm, tiny_qwen):
        ids = _ids(lm)
        _same(lm, [ids[0]], kw)
        batch = _same(lm, ids, kw)  # a left-padded batch of 3 (padded to 4 rows), rows finishing apart
        for p, res in zip(ids, batch):  # batch = alone, on the static path itself
            alone = generate_ids(lm, [p], DecodeConfig(**dict(dict(max_new_tokens=30, cache_block=8), **kw),
                                                        backend="static"))[0]
            assert res.token_ids == alone.token_ids


@pytest.mark.parametrize("kw", [dict(mode="ar"), dict(mode="mars", tau=0.7), dict(mode="verified", tau=0.0, drafts="both")])
def test_static_float32_equals_fast_and_hf(kw):
    lm = tiny.make_loaded("qwen2", seed=3, dtype=torch.float32)
    ids = _ids(lm)
    _same(lm, ids, kw)
    _same(lm, [ids[2]], kw, other="hf")


def test_tau1_and_verified_equal_greedy(tiny_lm):
    for p in _ids(tiny_lm):
        x = torch.tensor([p])
        ref = tiny_lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, do_sample=False)
        ref = ref[0, len(p):].tolist()
        for kw in (dict(mode="mars", tau=1.0), dict(mode="verified", tau=0.0), dict(mode="ar")):
            res = generate_ids(tiny_lm, [p], DecodeConfig(**kw, max_new_tokens=30, backend="static"))[0]
            assert res.token_ids == ref


def test_seeded_sampling_matches_the_fast_path(tiny_lm):
    ids = _ids(tiny_lm)
    _same(tiny_lm, ids, dict(mode="mars", tau=0.5, temperature=1.0, seed=3))


def test_records_keep_rejected_drafts_and_candidates(tiny_lm):
    ids = _ids(tiny_lm)[:1]
    cfg = dict(mode="mars", tau=0.5, max_new_tokens=16, top_k=3)
    a = [r for recs in decode_steps(tiny_lm, ids, DecodeConfig(**cfg, backend="static")) for r in recs]
    b = [r for recs in decode_steps(tiny_lm, ids, DecodeConfig(**cfg, backend="fast")) for r in recs]
    assert [(r.token_ids, r.rejected_token_ids, r.input_len) for r in a] == \
           [(r.token_ids, r.rejected_token_ids, r.input_len) for r in b]
    for x, y in zip(a, b):
        assert x.confidences == pytest.approx(y.confidences, abs=1e-6)
        assert [[t for t, _ in c] for c in x.candidates] == [[t for t, _ in c] for c in y.candidates]


def _gated_tiny():
    """A fresh tiny model with a gated adapter of random deltas on every projection (mars.models.gated)."""
    from mars.models.gated import GatedLoRA

    lm = tiny.make_loaded("llama", seed=11)
    g = torch.Generator().manual_seed(0)
    deltas = {}
    for name, mod in lm.model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "layers" in name:
            a = torch.randn(4, mod.in_features, generator=g, dtype=torch.float64) * 0.3
            b = torch.randn(mod.out_features, 4, generator=g, dtype=torch.float64) * 0.3
            deltas[name] = (a, b)
    GatedLoRA(lm.mask_token_id, deltas).attach(lm.model)
    return lm


def test_gated_adapter_same_tokens_as_fast_and_hf():
    lm = _gated_tiny()
    ids = _ids(lm)
    for kw in (dict(mode="mars", tau=0.5), dict(mode="mars", tau=1.0), dict(mode="verified", tau=0.0), dict(mode="ar")):
        _same(lm, ids, kw)
        _same(lm, [ids[1]], kw, other="hf")
    shapes = static_model(lm.model).shapes
    assert any(g for _, _, g in shapes) and any(not g for _, _, g in shapes)  # both graphs: with masks and without


def test_runs_alive_at_once_keep_their_own_buffers(tiny_lm):
    """Two generations interleaved pass by pass (the app's race) each get their own static cache."""
    ids = _ids(tiny_lm)
    cfg = dict(max_new_tokens=24, backend="static")
    alone = [generate_ids(tiny_lm, [p], DecodeConfig(mode=m, **cfg))[0].token_ids for p, m in zip(ids, ("mars", "ar"))]
    gens = [decode_steps(tiny_lm, [p], DecodeConfig(mode=m, **cfg)) for p, m in zip(ids, ("mars", "ar"))]
    got = [[], []]
    live = [0, 1]
    while live:
        for i in list(live):
            recs = next(gens[i], None)
            if recs is None:
                live.remove(i)
            else:
                got[i] += [t for r in recs for t in r.token_ids]
    assert got == alone


def test_bucketing_bounds_the_shapes(tiny_lm):
    """Every pass of ar, mars, verified (every group) and batches runs at one of a few shapes: few graphs to
    capture, and fewer than dynamo's recompile limit per batch size."""
    slm = StaticLM(tiny_lm.model)  # count this test's shapes only
    ids = _ids(tiny_lm)
    widths = set()
    for kw in CONFIGS:
        for batch in ([ids[0]], ids):
            for recs in decode_steps(tiny_lm, batch, DecodeConfig(**kw, max_new_tokens=30, cache_block=8,
                                                                    backend="static"), backend=_on(slm)):
                widths.update(r.input_len for r in recs)
    decode = slm.shapes  # the prompts are short: their prefill runs at a bucket too
    assert len(widths) > 6  # many distinct pass widths ...
    assert {w for _, w, _ in decode} <= set(WIDTHS)  # ... run at a few shapes
    assert {b for b, _, _ in decode} <= set(BATCHES)
    for b in {b for b, _, _ in decode}:
        assert len({(w, g) for bb, w, g in decode if bb == b}) <= 8


def test_step_compiles_without_graph_breaks_at_every_width(tiny_qwen):
    """fullgraph=True raises at any graph break; the "eager" backend needs no C++ compiler. One compile per
    width, as the CUDA path captures one graph per width (dynamo's cache is reset in between)."""
    lm = _gated_tiny()
    for model, gated in ((tiny_qwen.model, False), (lm.model, True)):
        slm = StaticLM(model)
        st = slm.acquire(2, 256)
        N = st.columns
        for W in (WIDTHS if not gated else (1, 8)):
            torch._dynamo.reset()
            step = torch.compile(slm.step, fullgraph=True, backend="eager", dynamic=False)
            ids = torch.randint(5, 40, (2, W))
            if gated:
                ids[:, 1:] = lm.mask_token_id
            pos = torch.arange(10, 10 + W).expand(2, W)
            allowed = torch.zeros(2, W, N, dtype=torch.bool)
            allowed[:, :, :10] = True
            allowed[:, :, 10:10 + W] = torch.tril(torch.ones(W, W, dtype=torch.bool))
            cols = torch.arange(10, 10 + W)
            with torch.inference_mode():
                k0, v0 = st.k.clone(), st.v.clone()
                got = step(ids, pos, allowed, cols, st.k, st.v, gated)
                kc, vc = st.k.clone(), st.v.clone()
                st.k.copy_(k0), st.v.copy_(v0)
                ref = slm.step(ids, pos, allowed, cols, st.k, st.v, gated)
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
            assert torch.equal(kc, st.k) and torch.equal(vc, st.v)  # the KV is written in place under compile too
    torch._dynamo.reset()


def test_auto_picks_fast_on_the_cpu_and_static_elsewhere(tiny_lm):
    assert resolve_backend(tiny_lm.model, "auto") == "fast"  # nothing changes on the CPU
    meta = tiny.make_model(tiny.make_tokenizer(), dtype=torch.float32).to("meta")  # stands for a GPU's model
    assert resolve_backend(meta, "auto") == "static"
    assert resolve_backend(meta, "static") == "static"


def test_to_host_one_copy():
    tok, conf, n = torch.tensor([5, 7]), torch.tensor([0.25, 0.9], dtype=torch.float32), torch.tensor(2)
    assert to_host(tok, conf, n) == [[5, 7], conf.tolist(), 2]
    assert _in_one_copy((tok, conf, n)) == [[5, 7], conf.tolist(), 2]  # the GPU's route: one copy, same values
    with pytest.raises(ValueError):
        to_host(torch.zeros(2, 2))


class _FakeGraphs:
    """torch.cuda's graph API, imitated on the CPU to check the host side of capture and replay: a captured
    call runs nothing (its output is NaN until a replay), a replay reruns it on the static buffers as they
    are then. Stale inputs, a missing replay or a reused output buffer would change the tokens."""

    def __init__(self, slm):
        self.captured = []
        self.capturing = None
        real = slm.run_step

        def run_step(*args):
            if self.capturing is None:
                return real(*args)
            out = torch.full_like(real(*args), float("nan"))
            self.capturing.calls.append(lambda: out.copy_(real(*args)))
            return out

        slm.run_step = run_step
        fake = self

        class CUDAGraph:
            def __init__(self):
                self.calls = []
                fake.captured.append(self)

            def replay(self):
                for call in self.calls:
                    call()

        class Stream:
            def wait_stream(self, other):
                pass

        from contextlib import contextmanager

        @contextmanager
        def graph(g, pool=None, capture_error_mode="global"):
            self.capturing = g
            yield
            self.capturing = None

        @contextmanager
        def stream(s):
            yield

        self.api = dict(CUDAGraph=CUDAGraph, Stream=Stream, graph=graph, stream=stream,
                        current_stream=lambda: Stream(), graph_pool_handle=lambda: object())


def test_graph_capture_and_replay_host_logic(monkeypatch, tiny_lm):
    """The CUDA route (one graph per shape, inputs copied into static buffers, replayed) on fake graphs."""
    slm = StaticLM(tiny_lm.model)
    fake = _FakeGraphs(slm)
    for name, fn in fake.api.items():
        monkeypatch.setattr(torch.cuda, name, fn, raising=False)
    slm.graphs_on = True
    ids = _ids(tiny_lm)
    for kw in (dict(mode="mars", tau=0.5), dict(mode="verified", tau=0.0, drafts="both"), dict(mode="ar")):
        _same(tiny_lm, ids, kw, slm=slm)
        _same(tiny_lm, [ids[0]], kw, slm=slm)
    assert 0 < len(fake.captured) == len({(b, w, g) for b, w, g in slm.shapes if w in WIDTHS})  # one capture per shape


def test_static_mars_batch_default_model(default_lm):
    from test_fastpath import DEFAULT_PROMPTS

    ids = [encode_prompt(default_lm.tokenizer, p) for p in DEFAULT_PROMPTS]
    _same(default_lm, ids, dict(mode="mars", tau=0.5, max_new_tokens=12))


@pytest.mark.slow
def test_static_decodes_the_fast_paths_tokens_default_model(default_lm):
    """float32, the real model (SmolLM2-135M), with its shipped B: ar, mars and verified, alone and batched."""
    from test_fastpath import DEFAULT_PROMPTS

    ids = [encode_prompt(default_lm.tokenizer, p) for p in DEFAULT_PROMPTS]
    for kw in (dict(mode="ar"), dict(mode="mars", tau=0.5), dict(mode="verified", tau=0.0, drafts="both")):
        _same(default_lm, ids, dict(kw, max_new_tokens=24))
        _same(default_lm, ids[:1], dict(kw, max_new_tokens=24))


def test_static_model_follows_weight_changes_and_frees_the_old_one():
    import gc
    import weakref

    lm = tiny.make_loaded("llama", seed=5)
    a = static_model(lm.model)
    assert static_model(lm.model) is a
    with torch.no_grad():
        lm.model.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # e.g. an optimizer step between evaluations
    b = static_model(lm.model)
    assert b is not a
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None  # the old buffers do not pile up
    _same(lm, _ids(lm)[:1], dict(mode="mars", tau=0.5), other="hf")  # and the new one runs the new weights


def test_live_tau_reaches_the_next_pass(tiny_lm):
    """tau is not part of any graph (the acceptance runs after the pass), so a slider still steers a run."""
    from mars.decoding.decoder import DecodeControl, stream

    control = DecodeControl()
    seen = []
    for rec in stream(tiny_lm, _ids(tiny_lm)[2], DecodeConfig(tau=1.0, max_new_tokens=30, backend="static"), control):
        seen.append(rec)
        if rec.pass_index == 2:
            control.tau = 0.0
    assert all(len(r.token_ids) == 1 for r in seen[:3]) and max(len(r.token_ids) for r in seen[3:]) > 1
