"""The device step (mars.decoding.device_step, backend "static-device") against today's host loop
(mars.decoding.decoder.decode_steps on the static backend): token for token in float32 in every mode, alone
and batched; record for record on a stub whose drafts are often right (so every acceptance branch runs); and
at most one device read per k steps, counted by a shim (benchmarks.host_cost.HostReads).

No GPU here: the step runs eagerly; the CUDA graph path (mars.runtime.step_runner) is the GPU session's."""

import math

import pytest
import torch

import tiny
from benchmarks.host_cost import HostReads, StubBackend, StubLM, StubStepRunner, prompts_for
from mars.decoding.decoder import DecodeConfig, DecodeControl, decode_steps, encode_prompt, generate_ids
from mars.decoding.static_tree import MAX_STATIC_NODES, static_tree
from mars.runtime.static import StaticLM
from test_fastpath import PROMPTS

# every mode the device step runs; "tree" entries: the static tree, whose passes differ from the host tree's
MODES = {
    "ar": dict(mode="ar"),
    "mars-0.7": dict(mode="mars", tau=0.7),
    "mars-0.0-b3": dict(mode="mars", tau=0.0, block_size=3),
    "mars-0.5-entropy": dict(mode="mars", tau=0.5, confidence="entropy", repeat_tau=None),
    "verified": dict(mode="verified", tau=0.0),
    "verified-last": dict(mode="verified", tau=0.0, verify_groups="last"),
    "verified-0.5-b3": dict(mode="verified", tau=0.5, block_size=3),
    "tree-16": dict(mode="verified", tau=0.0, tree_nodes=16),
}


def _device(kw):
    return DecodeConfig(**dict(kw, backend="static-device"))


@pytest.fixture(scope="module")
def f32():
    return [tiny.make_loaded("qwen2", seed=3, dtype=torch.float32), tiny.make_loaded("llama", seed=5, dtype=torch.float32)]


@pytest.mark.parametrize("name", list(MODES))
def test_device_step_equals_host_loop_float32(f32, name):
    """Token for token (and pass for pass, but for the tree) against the host loop on the static backend,
    alone and as a left-padded batch of 3 (padded to a bucket of 4 rows)."""
    for lm in f32:
        ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
        kw = dict(MODES[name], max_new_tokens=30, cache_block=8)
        for batch in ([ids[0]], ids):
            host = generate_ids(lm, batch, DecodeConfig(**kw, backend="static"))
            dev = generate_ids(lm, batch, _device(kw))
            assert [r.token_ids for r in dev] == [r.token_ids for r in host], (name, len(batch))
            if "tree" not in name:
                assert [r.passes for r in dev] == [r.passes for r in host], (name, len(batch))
            assert [r.finish_reason for r in dev] == [r.finish_reason for r in host]


def test_gated_adapter_device_step_equals_host_loop():
    """With a gated adapter the masks' rows take its deltas: the step passes the gate on (every pass with masks)."""
    from test_static import _gated_tiny

    lm = _gated_tiny()
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
    for kw in (dict(mode="mars", tau=0.5), dict(mode="verified", tau=0.0), dict(mode="ar")):
        kw = dict(kw, max_new_tokens=20)
        host = generate_ids(lm, ids, DecodeConfig(**kw, backend="static"))
        dev = generate_ids(lm, ids, _device(kw))
        assert [r.token_ids for r in dev] == [r.token_ids for r in host]
        assert [r.passes for r in dev] == [r.passes for r in host]


# ---- on the stub: drafts right ~60% of the time, so multi-token acceptance, rejection and guards all run


class _StubLM:
    """The tests' tiny tokenizer around StubLM (the model is never called: the backends are stubs)."""

    def __init__(self, eos=None):
        base = tiny.make_loaded()
        self.tokenizer, self.mask_token_id = base.tokenizer, base.mask_token_id
        self.eos_token_ids = list(eos) if eos is not None else list(base.eos_token_ids)
        self.model = base.model
        self.stub = StubLM(len(self.tokenizer), self.mask_token_id, 8)


@pytest.fixture(scope="module")
def stub_lm():
    return _StubLM()


def _stub_runs(lm, kw, batch, k=4, control=None):
    prompts = prompts_for(batch, len(lm.tokenizer))
    cfg = DecodeConfig(**kw)
    host = generate_ids(lm, prompts, cfg, backend=lambda m, c, b, cap: StubBackend(lm.stub, b))
    runner = []

    def make(m, c, b, cap, scratch):
        runner.append(StubStepRunner(lm.stub, b))
        return runner[-1]

    dev = generate_ids(lm, prompts, DecodeConfig(**dict(kw, backend="static-device", steps_per_read=k)), control,
                       backend=make)
    return host, dev, runner[0]


FIELDS = ("token_ids", "rejected_token_ids", "finish_reason", "drafts_sent", "draft_source", "repeat_guard")

STUB_MODES = [
    dict(mode="ar", tau=1.0), dict(mode="mars", tau=0.9), dict(mode="mars", tau=0.7), dict(mode="mars", tau=0.3),
    dict(mode="mars", tau=0.0, repeat_tau=0.95), dict(mode="mars", tau=0.0, repeat_tau=None, max_tokens_per_pass=2),
    dict(mode="mars", tau=0.6, confidence="margin"), dict(mode="mars", tau=0.5, block_size=6),
    dict(mode="verified", tau=0.0), dict(mode="verified", tau=0.0, verify_groups="last"),
    dict(mode="verified", tau=0.6), dict(mode="verified", tau=0.0, max_tokens_per_pass=2),
    dict(mode="verified", tau=0.0, block_size=1), dict(mode="mars", tau=0.0, block_size=1),
]


@pytest.mark.parametrize("kw", STUB_MODES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
@pytest.mark.parametrize("batch", [1, 5])
def test_device_step_records_equal_host_loop_on_stub(stub_lm, kw, batch):
    kw = dict(kw, max_new_tokens=40)
    host, dev, _ = _stub_runs(stub_lm, kw, batch)
    assert sum(r.passes for r in host) > 0
    for h, d in zip(host, dev):
        assert d.token_ids == h.token_ids and d.passes == h.passes
        for a, b in zip(h.steps, d.steps):
            assert {f: getattr(b, f) for f in FIELDS} == {f: getattr(a, f) for f in FIELDS}
            assert b.confidences == pytest.approx(a.confidences, abs=1e-5)
            assert b.rejected_confidences == pytest.approx(a.rejected_confidences, abs=1e-5)
    if kw["mode"] != "ar" and kw.get("block_size", 4) > 1 and kw["tau"] < 0.95:
        assert any(len(s.token_ids) > 1 for r in dev for s in r.steps)  # drafts were accepted: the test bites


def test_draft_calibration_as_the_host_loop(stub_lm):
    """An adapter's per-mask temperatures (mars.json "calibration") change the masks' confidences, so which
    drafts pass tau: the same records as the host loop."""
    lm = _StubLM()
    lm.calibration = {"temperatures": [1.6, 0.7]}  # mask 3 past the list: 1.0
    for kw in (dict(mode="mars", tau=0.7), dict(mode="verified", tau=0.6), dict(mode="mars", tau=0.5, confidence="entropy")):
        host, dev, _ = _stub_runs(lm, dict(kw, max_new_tokens=40), 3)
        plain, _, _ = _stub_runs(stub_lm, dict(kw, max_new_tokens=40), 3)
        assert [s.token_ids for r in dev for s in r.steps] == [s.token_ids for r in host for s in r.steps]
        assert [s.rejected_token_ids for r in dev for s in r.steps] == [s.rejected_token_ids for r in host for s in r.steps]
        assert [s.confidences for r in host for s in r.steps] != [s.confidences for r in plain for s in r.steps]


def test_eos_inside_an_accepted_run_and_stop_strings(stub_lm):
    """An EOS cuts a multi-token run (kept, the rest rejected); a stop string ends the row on the host at a
    read, the device's further steps for it dropped."""
    words = stub_lm.stub.texts[0, 40:60].tolist()
    eos_lm = _StubLM(eos=[words[0]])
    for kw in (dict(mode="mars", tau=0.0), dict(mode="verified", tau=0.0), dict(mode="ar")):
        host, dev, _ = _stub_runs(eos_lm, dict(kw, max_new_tokens=80), 3)
        assert [r.finish_reason for r in dev] == [r.finish_reason for r in host]
        assert [r.token_ids for r in dev] == [r.token_ids for r in host]
        assert [s.rejected_token_ids for r in dev for s in r.steps] == [s.rejected_token_ids for r in host for s in r.steps]
    assert any(r.finish_reason == "eos" for r in host)
    stop = stub_lm.tokenizer.decode(words[5:7])
    for kw in (dict(mode="mars", tau=0.0), dict(mode="verified", tau=0.0)):
        host, dev, _ = _stub_runs(stub_lm, dict(kw, max_new_tokens=80, stop_strings=(stop,)), 3)
        assert [r.token_ids for r in dev] == [r.token_ids for r in host]
        assert [r.finish_reason for r in dev] == [r.finish_reason for r in host]
    assert any(r.finish_reason == "stop" for r in host)


def test_static_tree_is_lossless_and_saves_passes(stub_lm):
    """The static tree's text is the AR text (the walk accepts only the model's own tokens), in fewer passes
    than AR; bigger budgets never lose tokens."""
    for batch in (1, 5):
        ar, _, _ = _stub_runs(stub_lm, dict(mode="ar", max_new_tokens=60), batch)
        for nodes in (1, 4, 16, 64):
            _, dev, _ = _stub_runs(stub_lm, dict(mode="verified", tau=0.0, tree_nodes=nodes, max_new_tokens=60), batch)
            assert [r.token_ids for r in dev] == [r.token_ids for r in ar], nodes
            assert sum(r.passes for r in dev) < sum(r.passes for r in ar), nodes
    # a tau filter: candidates below it never enter (tau 1: no node, so one token a pass)
    _, dev, _ = _stub_runs(stub_lm, dict(mode="verified", tau=1.0, tree_nodes=16, max_new_tokens=30), 1)
    assert dev[0].token_ids == ar[0].token_ids[:30] and dev[0].passes == 30


def test_static_tree_shape():
    for nodes in (1, 2, 16, 32, MAX_STATIC_NODES):
        for depth in (1, 3, 6):
            parents, ranks = static_tree(nodes, depth)
            # as many nodes as asked, but for a shallow tree: 16 candidates per depth (tree.MAX_BRANCH) at most
            assert len(parents) == len(ranks) == min(nodes, sum(16 ** i for i in range(1, depth + 1)))
            nodes = len(parents)
            assert all(-1 <= p < i for i, p in enumerate(parents))  # a parent comes first: closed under ancestors
            d = []
            for p in parents:
                d.append(1 if p < 0 else d[p] + 1)
            assert max(d) <= depth
            chain = min(depth, nodes)
            assert list(parents[:chain]) == list(range(-1, chain - 1)) and set(ranks[:chain]) == {0}  # top-1 chain first
            sib = [(p, r) for p, r in zip(parents, ranks)]
            assert len(set(sib)) == nodes  # siblings hold distinct ranks: distinct tokens
    with pytest.raises(ValueError, match="1 to 64"):
        static_tree(65, 3)


# ---- device reads: at most one per k steps


@pytest.mark.parametrize("kw", [dict(mode="ar"), dict(mode="mars", tau=0.7), dict(mode="verified", tau=0.0),
                                dict(mode="verified", tau=0.0, verify_groups="last"),
                                dict(mode="verified", tau=0.0, tree_nodes=16)],
                         ids=["ar", "mars", "verified", "verified-last", "tree"])
@pytest.mark.parametrize("k", [1, 4])
def test_one_device_read_per_k_steps(stub_lm, kw, k):
    for batch in (1, 3):
        kw2 = dict(kw, max_new_tokens=33)
        _stub_runs(stub_lm, kw2, batch, k)  # first run: a layout's fixed masks are built once (host tensors)
        prompts = prompts_for(batch, len(stub_lm.tokenizer))
        runner = []

        def make(m, c, b, cap, scratch):
            runner.append(StubStepRunner(stub_lm.stub, b))
            return runner[-1]

        cfg = DecodeConfig(**dict(kw2, backend="static-device", steps_per_read=k))
        with HostReads() as reads:
            runs = generate_ids(stub_lm, prompts, cfg, backend=make)
        steps = runner[0].steps
        passes = max(r.passes for r in runs)
        assert steps % k == 0 and steps - passes < k  # at most one read's worth of steps past the end
        assert reads.n == steps // k, reads.where  # ONE read per k steps, nothing else
        assert reads.n <= math.ceil(passes / k)
    # the shim itself counts what it should (the host loop reads the device several times a pass)
    with HostReads() as reads:
        host = generate_ids(stub_lm, prompts, DecodeConfig(**kw2), backend=lambda m, c, b, cap: StubBackend(stub_lm.stub, b))
    assert reads.n >= max(r.passes for r in host)


def test_shim_counts_reads():
    x = torch.arange(6)
    with HostReads() as reads:
        x.tolist(), x[0].item(), bool(x[1]), int(x[2]), x.nonzero(), x[x > 2], x.numpy()
        y = x * 2 + 1  # device work only
    assert reads.n == 7, reads.where
    assert torch.Tensor.tolist(y) == [1, 3, 5, 7, 9, 11]  # unpatched after the block


# ---- live control, refusals, the runtime's per-row columns


def test_live_tau_and_cancel_at_reads(stub_lm):
    prompts = prompts_for(2, len(stub_lm.tokenizer))
    control = DecodeControl()
    cfg = DecodeConfig(mode="mars", tau=1.0, max_new_tokens=60, backend="static-device", steps_per_read=2)
    make = lambda m, c, b, cap, scratch: StubStepRunner(stub_lm.stub, b)
    seen = []
    for records in decode_steps(stub_lm, prompts, cfg, control, backend=make):
        seen.append(records)
        if len(seen) == 4:
            control.tau = 0.0  # from the next read on, every proposal is accepted
        if len(seen) == 8:
            control.cancel()
    assert all(len(r.token_ids) == 1 for recs in seen[:4] for r in recs)  # tau 1: AR
    assert all(len(r.token_ids) == 4 for recs in seen[4:8] for r in recs)
    assert len(seen) == 8  # cancelled at the read after the 8th step


@pytest.mark.parametrize("kw, words", [
    (dict(mode="jacobi"), "mode 'jacobi'"), (dict(mode="mars", temperature=1.0, seed=1), "sampling"),
    (dict(mode="verified", drafts="both"), "drafts 'both'"), (dict(mode="mars", top_k=3), "top k"),
    (dict(mode="verified", tree_nodes=65), "more than 64"), (dict(mode="verified", tree_nodes=4, block_size=1), "block size 1"),
])
def test_refused_settings_say_why(kw, words):
    with pytest.raises(ValueError, match="static-device") as e:
        _device(kw)
    assert words in str(e.value)


def test_static_step_per_row_columns_equal_shared_columns(f32):
    """StaticLM.step with a write column per row (the device step's) = the shared columns (the host loop's)."""
    slm = StaticLM(f32[0].model)
    f = slm.fast
    b, W, N = 2, 3, 16
    shape = (f.n_layers, b, f.n_kv, N, f.head_dim)
    ids = torch.randint(5, 100, (b, W))
    pos = torch.arange(W).expand(b, W)
    allowed = torch.zeros(b, W, N, dtype=torch.bool)
    allowed[:, :, 4:4 + W] = torch.ones(W, W, dtype=torch.bool).tril()
    cols = torch.arange(4, 4 + W)
    outs = []
    for c in (cols, cols.expand(b, W).contiguous()):
        k, v = torch.zeros(shape, dtype=f.dtype), torch.zeros(shape, dtype=f.dtype)
        outs.append((slm.step(ids, pos, allowed, c, k, v, False), k, v))
    for a, b_ in zip(outs[0], outs[1]):
        assert torch.equal(a, b_)


# ---- ready for capture: a step is one graph, with no host sync and no data-dependent shape inside


class _Compiled:
    """Runs each step through torch.compile(fullgraph=True): dynamo refuses a step that reads a value back to
    the host (.item(), bool(), .tolist()) or makes a shape from values (nonzero, masked indexing) - what a
    CUDA graph cannot capture either."""

    def __init__(self, runner):
        self.runner = runner
        self.batch, self.device, self.forward = runner.batch, runner.device, runner.forward
        self.compiled = 0

    def run(self, key, step):
        if key is None:  # the prefill: its own width, never captured
            return self.runner.run(key, step)
        if not hasattr(step, "_compiled"):
            step._compiled = torch.compile(step.__call__, fullgraph=True, backend="eager", dynamic=False)
            self.compiled += 1
        step._compiled()


def test_every_step_compiles_as_one_graph(stub_lm, f32):
    from mars.runtime.step_runner import StepRunner

    for kw in (dict(mode="ar"), dict(mode="mars", tau=0.7), dict(mode="verified", tau=0.0),
               dict(mode="verified", tau=0.0, verify_groups="last"), dict(mode="verified", tau=0.0, tree_nodes=16)):
        cfg = DecodeConfig(**kw, max_new_tokens=24, backend="static-device")
        prompts = prompts_for(3, len(stub_lm.tokenizer))
        made = []
        make = lambda m, c, b, cap, scratch: made.append(_Compiled(StubStepRunner(stub_lm.stub, b))) or made[-1]
        eager = generate_ids(stub_lm, prompts, cfg, backend=lambda m, c, b, cap, scratch: StubStepRunner(stub_lm.stub, b))
        assert [r.token_ids for r in generate_ids(stub_lm, prompts, cfg, backend=make)] == [r.token_ids for r in eager]
        assert made[0].compiled == 1
    # and with the model's own pass inside (mars.runtime.static.StaticLM.step): the whole step, one graph
    lm = f32[0]
    ids = [encode_prompt(lm.tokenizer, p) for p in PROMPTS]
    cfg = DecodeConfig(mode="verified", tau=0.0, max_new_tokens=12, backend="static-device")
    make = lambda m, c, b, cap, scratch: _Compiled(StepRunner(m, b, cap, scratch))
    assert [r.token_ids for r in generate_ids(lm, ids, cfg, backend=make)] == \
           [r.token_ids for r in generate_ids(lm, ids, cfg)]


def test_bench_runs_the_device_step_beside_the_host_loop(f32):
    """`python -m mars bench --also-backends static-device`: the core's methods again on the device step, exact
    against the same AR; a method it cannot run (lookup drafts) is dropped, saying why."""
    from mars.evaluation.bench import BenchConfig, run_bench

    cfg = BenchConfig(PROMPTS[:2], methods=("ar", "mars", "verified", "verified_tree_mars:8", "verified_both"),
                      taus=(0.7,), max_new_tokens=10, backend="static", also_backends=("static-device",))
    status = {}
    runs = {r.method: r for r in run_bench(f32[0], cfg, status=status)}
    for m in ("ar", "mars", "verified", "verified_tree_mars:8"):
        assert runs[m + "@static-device"].exact_match_with_ar == 1.0, m
    assert "verified_both@static-device" not in runs and "verified_both" in runs
    assert "drafts 'both'" in str(status.get("failed"))


class _Async(StubStepRunner):
    asynchronous = True  # as CUDA: the next k steps are queued before the last k's records are built


@pytest.mark.parametrize("kw", [dict(mode="mars", tau=0.7), dict(mode="verified", tau=0.0, tree_nodes=16),
                                dict(mode="verified", tau=0.0, stop_strings=("the",))])
def test_overlapped_reads_give_the_same_records(stub_lm, kw):
    prompts = prompts_for(3, len(stub_lm.tokenizer))
    cfg = DecodeConfig(**kw, max_new_tokens=40, backend="static-device")
    plain = generate_ids(stub_lm, prompts, cfg, backend=lambda m, c, b, cap, scratch: StubStepRunner(stub_lm.stub, b))
    made = []
    make = lambda m, c, b, cap, scratch: made.append(_Async(stub_lm.stub, b)) or made[-1]
    with HostReads() as reads:
        over = generate_ids(stub_lm, prompts, cfg, backend=make)
    assert [[s.to_dict() | {"seconds": 0} for s in r.steps] for r in over] == \
           [[s.to_dict() | {"seconds": 0} for s in r.steps] for r in plain]
    # one read per 4 steps; a stop string found at a read may leave the 4 steps queued after it unread
    assert reads.n <= made[0].steps // 4 and 4 * reads.n >= max(r.passes for r in over)
    if not kw.get("stop_strings"):
        assert reads.n == made[0].steps // 4


class _Watch(StubStepRunner):
    """Checks, at every pass, that a finished row writes no real KV column and that its state stands still."""

    def run(self, key, step):
        st = step.st
        self.done = st.done.clone()
        before = [t.clone() for t in (st.seq, st.F, st.L)]
        self.capacity = step.c.capacity
        super().run(key, step)
        for a, b in zip(before, (st.seq, st.F, st.L)):
            assert torch.equal(a[self.done], b[self.done])
        self.finished_seen = getattr(self, "finished_seen", 0) + int(self.done.sum()) - (self.batch - 3)

    def forward(self, ids, positions, allowed, cols, gated):
        assert bool((cols[self.done] >= self.capacity).all())  # scratch columns only
        return super().forward(ids, positions, allowed, cols, gated)


def test_a_finished_row_stops_writing(stub_lm):
    words = stub_lm.stub.texts[1, 40:60].tolist()
    eos_lm = _StubLM(eos=[words[0]])
    prompts = prompts_for(3, len(eos_lm.tokenizer))
    for kw in (dict(mode="mars", tau=0.0), dict(mode="verified", tau=0.0), dict(mode="verified", tau=0.0, tree_nodes=8)):
        made = []
        make = lambda m, c, b, cap, scratch: made.append(_Watch(eos_lm.stub, b)) or made[-1]
        runs = generate_ids(eos_lm, prompts, DecodeConfig(**kw, max_new_tokens=80, backend="static-device"), backend=make)
        assert len({r.passes for r in runs}) > 1 and made[0].finished_seen > 0  # rows finished apart: it was checked


def test_the_gpu_sessions_check_runs_here(tiny_dir, tmp_path):
    """tools/device_step_check.py (the GPU check of the device step) on the CPU at tiny sizes: it runs and
    reports the device step's text equal to the host loop's and the eager step's."""
    import json

    from tools.device_step_check import main

    out = tmp_path / "check.json"
    assert main(["--device", "cpu", "--dtype", "float32", "--model", str(tiny_dir), "--adapter", "none", "--limit", "2",
                 "--max-new-tokens", "6", "--batches", "2", "--methods", "ar", "verified", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["graph_equals_eager"] == {"ar": 1.0, "verified": 1.0}
    runs = res["decode"]["batch_2"]
    assert set(runs) == {"ar|host", "ar|device k4", "verified|host", "verified|device k4"}
    assert all(r["same_text_as_host_loop"] == 1.0 and r["tokens"] == 12 for r in runs.values())
