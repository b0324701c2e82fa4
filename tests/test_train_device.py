"""The trainer on a device: the batch moves with `.to`, DataLoader workers build the same batches, the train
log says where each step's time goes, and bfloat16 autocast on CUDA is not held to the CPU's checks."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mars.training.objective import Collate, Example, MarsBatch, build_batch
from mars.training.phases import PHASES, PhaseTimer, throughput

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def examples():
    return [Example([5, 6, 7], [8, 9, 10, 11, 2]), Example([5, 6], [12, 13, 2]), Example([4] * 6, [9] * 9, False)]


def test_marsbatch_to_moves_every_tensor_and_keeps_the_layout():
    batch = build_batch(examples(), 4, 99, 2)
    moved = batch.to("meta")  # a device every machine has: proves each tensor went, not only input_ids
    tensors = [f for f, v in vars(batch).items() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 5
    for f in tensors:
        assert getattr(moved, f).device.type == "meta" and getattr(batch, f).device.type == "cpu"
        assert getattr(moved, f).shape == getattr(batch, f).shape and getattr(moved, f).dtype == getattr(batch, f).dtype
    assert moved.clean_len == batch.clean_len
    back = batch.to("cpu")
    assert all(torch.equal(getattr(back, f), getattr(batch, f)) for f in tensors)


def test_accelerate_sends_the_batch_through_its_to():
    from accelerate.utils import send_to_device

    moved = send_to_device(build_batch(examples(), 4, 99, 2), "meta")
    assert isinstance(moved, MarsBatch) and moved.attention_mask.device.type == "meta"


def test_collate_is_build_batch_and_survives_pickling():
    exs = examples()
    plain = Collate(4, 99, 2, max_length=12)
    assert _same(plain(exs), build_batch(exs, 4, 99, 2, 12))
    grid = Collate(4, 99, 2, grids=True, seed=3, noisy_copies=2, shift_blocks=True, epoch=1)
    from mars.training.objective import draw_offsets

    items = list(enumerate(exs))
    offsets = [draw_offsets(3, 1, i, 4, 2, True) for i in range(3)]
    assert _same(grid(items), build_batch(exs, 4, 99, 2, offsets=offsets))
    copy = pickle.loads(pickle.dumps(grid))  # what a spawned DataLoader worker receives
    assert _same(copy(items), grid(items))


def test_dataloader_workers_build_the_same_batches_in_the_same_order():
    exs = examples() * 3
    collate = Collate(4, 99, 2, grids=True, seed=0, shift_blocks=True)

    def batches(workers):
        gen = torch.Generator().manual_seed(7)
        loader = torch.utils.data.DataLoader(list(enumerate(exs)), batch_size=2, shuffle=True, collate_fn=collate,
                                             generator=gen, num_workers=workers)
        return list(loader)

    plain, parallel = batches(0), batches(2)
    assert len(plain) == len(parallel) == 5
    assert all(_same(a, b) for a, b in zip(plain, parallel))


def _same(a: MarsBatch, b: MarsBatch) -> bool:
    return a.clean_len == b.clean_len and all(
        torch.equal(getattr(a, f), getattr(b, f))
        for f in ("input_ids", "position_ids", "attention_mask", "clean_labels", "noisy_labels"))


def test_phase_timer_splits_the_wall_time():
    ticks = iter([0.0, 1.0, 3.0, 3.5, 4.0, 10.0, 12.0])
    synced = []
    t = PhaseTimer(sync=lambda: synced.append(1), clock=lambda: next(ticks))
    t.mark("data")  # 1.0
    t.mark("forward_backward")  # 2.0
    t.mark("optimizer")  # 0.5
    t.mark("other")  # 0.5
    assert t.take() == {"data": 1.0, "forward_backward": 2.0, "optimizer": 0.5, "other": 0.5} and len(synced) == 4
    t.mark("data")  # 6.0
    t.mark("data")  # 2.0
    assert t.take()["data"] == 8.0 and t.total["data"] == 9.0
    with pytest.raises(ValueError, match="unknown phase"):
        t.mark("sleep")


def test_throughput_skips_the_first_steps():
    rows = [{"step": 1, "sequences": 4, "phases": {"data": 5.0, "forward_backward": 5.0}},
            {"step": 2, "sequences": 8, "phases": {"data": 0.5, "forward_backward": 1.5, "optimizer": 0.0}},
            {"step": 3, "sequences": 12, "phases": {"data": 0.5, "forward_backward": 1.5, "optimizer": 0.0}}]
    t = throughput(rows)
    assert t["steps"] == 2 and t["sequences"] == 8 and t["seconds"] == 4.0 and t["sequences_per_s"] == 2.0
    assert t["share"]["data"] == 0.25 and t["ms_per_step"]["forward_backward"] == 1500.0
    with pytest.raises(ValueError, match="need more than 1"):
        throughput(rows[:1])


def test_bfloat16_autocast_on_cuda_skips_the_cpu_checks():
    from mars.training.train import autocast_context

    factory = autocast_context("bfloat16", "cuda", flags={"avx2"})  # an AVX2-only host must not block the GPU
    assert callable(factory)
    with pytest.raises(ValueError, match="autocast bfloat16"):
        autocast_context("bfloat16", "cpu", flags={"avx2"})


def test_train_config_checks_workers_and_the_cli_defaults_autocast_by_device():
    from mars.cli import _train_autocast
    from mars.training.train import TrainConfig

    with pytest.raises(ValueError, match="workers must be >= 0"):
        TrainConfig(data="d", out="o", workers=-1)
    assert _train_autocast(None, "cpu") is None and _train_autocast("none", "cpu") is None
    assert _train_autocast("bfloat16", "cpu") == "bfloat16"
    if torch.cuda.is_available():
        assert _train_autocast(None, "auto") == "bfloat16"


def test_train_with_workers_logs_phases_and_matches_the_loop_without_workers(tiny_dir, tmp_path):
    """Workers build the same batches in the same order, so the losses are the same; every logged step
    says where its time went."""
    from test_cli_train import _data, train_args

    data = _data(tmp_path / "d.jsonl")
    logs = {}
    for workers in ("0", "2"):
        out = tmp_path / f"w{workers}"
        r = subprocess.run([sys.executable, "-m", "mars", *train_args(tiny_dir, data, out, 3, "--shift-blocks",
                                                                       "--device", "cpu", "--workers", workers)],
                           capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
        assert r.returncode == 0, r.stderr
        logs[workers] = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert summary["device"] == "cpu" and summary["workers"] == int(workers)
    assert [r["noisy"] for r in logs["0"]] == pytest.approx([r["noisy"] for r in logs["2"]], rel=1e-6)
    for row in logs["2"]:
        assert set(row["phases"]) == set(PHASES) and row["phases"]["forward_backward"] > 0
    t = throughput(logs["2"])
    assert t["steps"] == 2 and t["sequences"] == 2 * 2 * 2 and t["sequences_per_s"] > 0
