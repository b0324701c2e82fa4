"""The MARS trainer: LoRA or full fine-tuning, resumable, and unchanged under `accelerate launch`.

    python -m mars train --data train.jsonl --out runs/x --block-size 4 --method lora --lr 2e-4
    accelerate launch --multi_gpu --num_processes 2 -m mars train --data ... --out ...
    (on a machine without GPUs, --multi_gpu starts CPU processes that talk over gloo)

Checkpoints (`<out>/checkpoint/`: model, optimizer, scheduler and RNG state via accelerate, plus
trainer_state.json) are written every `save_every` optimizer steps and at the end; rerunning the same
command resumes from there, skipping the batches already seen. The final adapter (peft safetensors,
with mars.json: block size, mask token, base model, recipe) is what `mars.models.loading.load(adapter=...)`
takes back; full fine-tuning writes a whole model folder for `--model`.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class TrainConfig:
    data: str | list[str]  # chat-format JSONL (see mars.training.data); several files are read as one set
    out: str  # output folder: adapter or model, log.jsonl, checkpoint/
    model: str | None = None  # None = the embedded default (SmolLM2-135M-Instruct)
    adapter: str | None = None  # continue training from this adapter (LoRA only)
    mask_token: str | None = None  # overrides the model's mask token
    block_size: int = 4  # B of the training mask; inference uses up to B proposals per pass
    method: str = "lora"  # "lora" (small shippable delta) or "full"
    lora_r: int = 32
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = LORA_TARGETS  # all 7 projections: the trial that learned fastest
    lr: float = 2e-4
    schedule: str = "cosine"  # "cosine", "linear" or "constant", after linear warm-up
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps; overrides epochs
    max_minutes: float | None = None  # stop cleanly after this wall time (equal-time comparisons)
    max_cpu_minutes: float | None = None  # stop after this much CPU time of this process: arms that share
    #                                       cores get equal budgets however the cores were shared
    batch_size: int = 2  # sequences per micro-batch per process
    grad_accum: int = 4
    max_length: int = 512  # clean tokens per sequence (the forward sees up to 2x this)
    drop_prompt_noisy: bool = True  # noisy copies of whole prompt blocks carry no loss: skip them
    skip_last_slot: bool = False  # drop the loss of the last noisy slot per block (inference never uses it)
    loss_weighting: str = "token"  # "token": mean over all scored tokens; "sequence": the authors' (per sequence, then batch)
    shift_blocks: bool = False  # each draw of an example puts its noisy block grid at a random offset in [0, B)
    noisy_copies: int = 1  # noisy copies per clean copy, each on its own block grid (distinct offsets)
    gated: bool = False  # the adapter acts only at mask rows (mars.models.gated): real tokens run the bare
    #                      model, so tau = 1.0 is the bare model's greedy output and the clean copy needs no gradient
    distill: float = 0.0  # weight of KL(bare model || model) on the clean copy (LoRA: the bare model is the
    #                       base with the adapter switched off, one extra clean forward per micro-batch)
    save_every: int = 25  # optimizer steps between checkpoints
    select_data: str | None = None  # held-out JSONL: evaluate each snapshot teacher-forced, keep the best in <out>/best
    select_limit: int = 50  # held-out examples per snapshot evaluation
    select_threshold: float = 0.9  # drafts counted: confidence >= this
    select_precision: float = 0.9  # a snapshot qualifies when at least this share of those drafts is right
    seed: int = 0
    threads: int = 0  # torch threads per process (0 = default)
    dtype: str = "float32"
    device: str = "auto"  # "auto" (CUDA when present), "cpu" or "cuda" (mars.models.device); accelerate launch
    #                       places each process itself
    workers: int | None = None  # DataLoader processes building batch layouts off the loop (None: 4 on CUDA,
    #                             0 on the CPU, where the step itself needs every core)
    autocast: str | None = None  # "bfloat16": the forward's matmuls in bfloat16 (torch.autocast); weights, adapter,
    #                              gradients and optimizer stay in `dtype`. On a CPU with AMX a gated step costs
    #                              ~0.7x; refused where oneDNN has no bfloat16 path (AVX2-only CPUs)
    extra: dict = field(default_factory=dict)  # free-form notes recorded in mars.json

    def __post_init__(self):
        if self.method not in ("lora", "full"):
            raise ValueError(f"method must be 'lora' or 'full', got {self.method!r}")
        if self.distill < 0:
            raise ValueError(f"distill must be >= 0, got {self.distill}")
        if self.gated and (self.method != "lora" or self.distill):
            raise ValueError("--gated needs --method lora and no --distill (its clean copy is the bare model)")
        if self.distill and self.method != "lora":
            raise ValueError("--distill needs --method lora: the bare model is the base with the adapter off")
        if self.loss_weighting not in ("token", "sequence"):
            raise ValueError(f"loss_weighting must be 'token' or 'sequence', got {self.loss_weighting!r}")
        if not 1 <= self.noisy_copies <= self.block_size:
            raise ValueError(f"noisy_copies must be in [1, block_size={self.block_size}], got {self.noisy_copies}")
        if self.schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"schedule must be cosine, linear or constant, got {self.schedule!r}")
        for name in ("block_size", "batch_size", "grad_accum", "max_length", "save_every", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("max_minutes", "max_cpu_minutes"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.select_limit < 1:
            raise ValueError("select_limit must be >= 1")
        if not (0.0 <= self.select_threshold <= 1.0 and 0.0 <= self.select_precision <= 1.0):
            raise ValueError("select_threshold and select_precision must be in [0, 1]")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.autocast not in (None, "bfloat16"):
            raise ValueError(f"autocast must be None or 'bfloat16', got {self.autocast!r}")
        if not self.lr > 0:
            raise ValueError("lr must be > 0")
        self.lora_targets = tuple(self.lora_targets)


def lr_lambda(schedule: str, warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return f


def better_snapshot(best: dict | None, row: dict, min_precision: float) -> bool:
    """Snapshot choice by precision: among snapshots whose confident drafts (confidence >= threshold,
    teacher-forced) are right at least `min_precision` of the time, the one with the most confident drafts
    (the earlier one on a tie). A snapshot with no confident draft does not qualify."""
    if not row["count"] or row["precision"] is None or row["precision"] < min_precision:
        return False
    return best is None or row["count"] > best["count"]


def train(cfg: TrainConfig) -> dict:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed
    from tqdm.auto import tqdm

    from mars.training.data import load_examples
    from mars.models.loading import load
    from mars.models.device import resolve_device, synchronize
    from mars.training.objective import (Collate, clean_forward, distill_loss, forward_batch, gated_forward,
                                         mars_loss, noisy_loss)
    from mars.training.phases import PhaseTimer

    device = resolve_device(cfg.device)  # first: a missing GPU is one line, before any loading
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # a seedable sampler makes each epoch's order a function of (seed, epoch): a resumed run sees the same order
    acc = Accelerator(
        gradient_accumulation_steps=cfg.grad_accum,
        cpu=device == "cpu",
        # non_blocking: the pinned batch's copy to the GPU overlaps the work already queued
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=device == "cuda"),
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step below, whatever the process count
    )
    set_seed(cfg.seed)
    amp = autocast_context(cfg.autocast, acc.device.type)
    out = Path(cfg.out)
    ckpt = out / "checkpoint"
    lm = load(cfg.model, adapter="none", mask_token=cfg.mask_token, dtype=cfg.dtype)
    if lm.mask_token_id is None:
        raise ValueError("training MARS needs a mask token: pass --mask-token")
    tok, model = lm.tokenizer, lm.model
    eos_id = lm.eos_token_ids[0]
    paths = [cfg.data] if isinstance(cfg.data, str) else list(cfg.data)
    examples = [ex for path in paths for ex in load_examples(path, tok, eos_id, cfg.max_length)]

    if cfg.method == "lora":
        from peft import LoraConfig, PeftModel, get_peft_model

        if cfg.adapter:
            parent_gated = bool((_read_meta(Path(cfg.adapter)) or {}).get("gated"))
            if parent_gated != cfg.gated:
                raise ValueError(f"adapter {cfg.adapter!r} is {'' if parent_gated else 'not '}gated: "
                                 f"{'pass' if parent_gated else 'drop'} --gated to continue it")
            model = PeftModel.from_pretrained(model, cfg.adapter, is_trainable=True)
            # the adapter's own shape wins over the --lora-* flags: record it, so mars.json tells the truth
            pc = model.peft_config["default"]
            cfg = replace(cfg, lora_r=pc.r, lora_alpha=pc.lora_alpha, lora_dropout=pc.lora_dropout,
                          lora_targets=tuple(sorted(pc.target_modules)))
        else:
            lcfg = LoraConfig(
                r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                target_modules=list(cfg.lora_targets), task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lcfg)
        if cfg.gated:
            from mars.models.gated import gate_peft_model

            gate_peft_model(model, lm.mask_token_id)
    model.train()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False

    grids = cfg.shift_blocks or cfg.noisy_copies > 1
    collate = Collate(cfg.block_size, lm.mask_token_id, eos_id, cfg.max_length, cfg.drop_prompt_noisy,
                      cfg.skip_last_slot, grids=grids, seed=cfg.seed, noisy_copies=cfg.noisy_copies,
                      shift_blocks=cfg.shift_blocks)
    on_gpu = acc.device.type == "cuda"
    workers = cfg.workers if cfg.workers is not None else (4 if on_gpu else 0)

    gen = torch.Generator().manual_seed(cfg.seed)
    dataset = list(enumerate(examples)) if grids else examples  # the sampler's order depends on the length only
    # workers build the next batches while the device runs this one; pinned memory lets the copy overlap too
    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate,
                                         generator=gen, num_workers=workers, pin_memory=on_gpu,
                                         prefetch_factor=4 if workers else None)
    steps_per_epoch = math.ceil(len(loader) / (cfg.grad_accum * acc.num_processes))
    total = cfg.max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.schedule, int(cfg.warmup_ratio * total), total))
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

    state = {"step": 0, "epoch": 0, "batches_in_epoch": 0, "seconds": 0.0, "sequences": 0}
    if (ckpt / "trainer_state.json").is_file():
        acc.load_state(str(ckpt))
        state = json.loads((ckpt / "trainer_state.json").read_text())
        acc.print(f"resuming from {ckpt} at step {state['step']}")
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "log.jsonl"

    def save_checkpoint():
        acc.wait_for_everyone()
        acc.save_state(str(ckpt))
        if acc.is_main_process:
            (ckpt / "trainer_state.json").write_text(json.dumps(state))

    select_examples = None
    if cfg.select_data:
        from mars.jsonl import read_jsonl
        from mars.training.data import to_example

        select_examples = [to_example(r, tok, eos_id) for r in read_jsonl(cfg.select_data)[: cfg.select_limit]]

    def evaluate_snapshot():
        """Teacher-forced drafts of the current weights on the held-out set; the best so far goes to <out>/best."""
        from types import SimpleNamespace

        from mars.evaluation.evaluate import draft_accuracy

        nonlocal t_start, c_start
        t0, c0 = time.time(), time.process_time()
        if acc.is_main_process:
            m = acc.unwrap_model(model)
            m.eval()
            probe = SimpleNamespace(model=m, mask_token_id=lm.mask_token_id, eos_token_ids=[eos_id])
            res = draft_accuracy(probe, select_examples, cfg.block_size, threshold=cfg.select_threshold)
            m.train()
            row = {"step": state["step"], **{k: res.confident[k] for k in ("count", "right", "share", "precision")},
                   "accuracy_by_distance": res.accuracy_by_distance}
            row["selected"] = better_snapshot(state.get("best"), row, cfg.select_precision)
            if row["selected"]:
                state["best"] = {k: row[k] for k in ("step", "count", "right", "share", "precision")}
                _save_final(m, tok, lm, cfg, state, out / "best", selected=state["best"])
            with (out / "snapshots.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
        state["evaluated_step"] = state["step"]
        acc.wait_for_everyone()
        t_start += time.time() - t0  # train_seconds counts training, not these evaluations
        c_start += time.process_time() - c0

    bar = tqdm(total=total, initial=state["step"], disable=not acc.is_local_main_process, desc="mars train")
    t_start = time.time() - state["seconds"]
    c_start = time.process_time() - state.get("cpu_seconds", 0.0)
    run = {"noisy": 0.0, "clean": 0.0, "distill": 0.0, "n": 0}
    stop = state["step"] >= total
    timer = PhaseTimer(sync=lambda: synchronize(acc.device))
    while not stop:
        loader.set_epoch(state["epoch"]) if hasattr(loader, "set_epoch") else None
        collate.epoch = state["epoch"]  # before the epoch's iterator starts: workers take their copy then
        skip = state["batches_in_epoch"]
        epoch_loader = acc.skip_first_batches(loader, skip) if skip else loader
        for batch in epoch_loader:
            timer.mark("data")
            with acc.accumulate(model):
                per_sequence = cfg.loss_weighting == "sequence"
                with amp():  # the backward runs outside it, in the dtypes autocast recorded
                    if cfg.gated:
                        logits = gated_forward(model, batch, acc.unwrap_model(model).disable_adapter())
                        losses = noisy_loss(logits, batch, per_sequence)
                    else:
                        logits = forward_batch(model, batch)
                        losses = mars_loss(logits, batch, per_sequence)
                    if cfg.distill:
                        with torch.no_grad(), acc.unwrap_model(model).disable_adapter():
                            teacher = clean_forward(model, batch)
                        losses["distill"] = distill_loss(logits[:, : batch.clean_len], teacher, batch.clean_labels)
                        losses["loss"] = losses["loss"] + cfg.distill * losses["distill"]
                acc.backward(losses["loss"])
                timer.mark("forward_backward")
                if acc.sync_gradients:
                    acc.clip_grad_norm_(params, 1.0)
                opt.step()
                if acc.sync_gradients:
                    sched.step()
                opt.zero_grad()
                timer.mark("optimizer")
            state["batches_in_epoch"] += 1
            state["sequences"] += batch.input_ids.shape[0] * acc.num_processes
            run["noisy"] += losses["noisy"].item()
            run["clean"] += losses["clean"].item() if "clean" in losses else 0.0
            run["distill"] += losses["distill"].item() if "distill" in losses else 0.0
            run["n"] += 1
            if not acc.sync_gradients:
                timer.mark("other")
                continue
            state["step"] += 1
            state["seconds"] = time.time() - t_start
            state["cpu_seconds"] = time.process_time() - c_start
            row = {
                "step": state["step"], "noisy": run["noisy"] / run["n"], "clean": run["clean"] / run["n"],
                "lr": sched.get_last_lr()[0], "seconds": round(state["seconds"], 1), "sequences": state["sequences"],
            }
            timer.mark("other")
            row["phases"] = timer.take()  # this step's seconds: data wait, forward+backward, optimizer, other
            if cfg.distill:
                row["distill"] = run["distill"] / run["n"]
            if cfg.gated:
                del row["clean"]  # the bare model's own loss: not trained, not computed
            run = {"noisy": 0.0, "clean": 0.0, "distill": 0.0, "n": 0}
            if acc.is_main_process:
                with log_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            bar.update(1)
            bar.set_postfix({k: f"{row[k]:.3f}" for k in ("noisy", "clean", "distill") if k in row})
            out_of_time = ((cfg.max_minutes is not None and state["seconds"] > 60 * cfg.max_minutes)
                           or (cfg.max_cpu_minutes is not None and state["cpu_seconds"] > 60 * cfg.max_cpu_minutes))
            if state["step"] >= total or out_of_time:
                stop = True
                break
            if state["step"] % cfg.save_every == 0:
                if select_examples is not None:
                    evaluate_snapshot()
                save_checkpoint()
                timer.mark("other")  # counted in the next step's row
        else:
            state["epoch"] += 1
            state["batches_in_epoch"] = 0
    bar.close()
    if select_examples is not None and state.get("evaluated_step") != state["step"]:
        evaluate_snapshot()  # the final weights, unless this step was just evaluated
    save_checkpoint()
    acc.wait_for_everyone()
    state["processes"] = acc.num_processes
    state["device"] = str(acc.device)
    state["workers"] = workers
    if acc.is_main_process:
        _save_final(acc.unwrap_model(model), tok, lm, cfg, state, out)
    acc.wait_for_everyone()
    return state


def autocast_context(autocast: str | None, device_type: str, flags: set[str] | None = None):
    """A factory of the forward's autocast context: a no-op for None; bfloat16 on a CPU is refused, before
    any work, where oneDNN has no bfloat16 path (`flags`: this CPU's by default, tests pass others)."""
    import contextlib

    import torch

    if autocast is None:
        return contextlib.nullcontext
    if device_type == "cpu":
        from mars.runtime.cpu import bf16_unsupported_reason, cpu_flags

        flags = cpu_flags() if flags is None else flags  # read once: the check and the warning both need them
        reason = bf16_unsupported_reason(flags, advice="train without --autocast (float32)")
        if reason:
            raise ValueError("--autocast bfloat16: " + reason)
        if flags is not None and not flags & {"amx_bf16", "avx512_bf16"}:
            warnings.warn("--autocast bfloat16 on a CPU without AMX or AVX512-BF16 is emulated: "
                          "it may be slower than float32", stacklevel=2)
    return lambda: torch.autocast(device_type, dtype=torch.bfloat16)


def _save_final(model, tok, lm, cfg: TrainConfig, state: dict, out: Path, selected: dict | None = None):
    from mars.models.loading import MARS_META

    meta = {
        "base_model": lm.name,
        "block_size": cfg.block_size,
        "mask_token": lm.mask_token,
        "method": cfg.method,
        "gated": cfg.gated,
        "steps": state["step"],
        "sequences": state["sequences"],
        "train_seconds": round(state["seconds"], 1),
        "train_cpu_seconds": round(state.get("cpu_seconds", 0.0), 3),
        "processes": state.get("processes", 1),
        "data": cfg.data if isinstance(cfg.data, str) else [str(p) for p in cfg.data],
        "recipe": {k: v for k, v in asdict(cfg).items() if k not in ("data", "out")},
    }
    if selected is not None:  # a snapshot kept by --select-data: why it was kept
        meta["selected_by"] = {"rule": f"most teacher-forced drafts >= {cfg.select_threshold} among snapshots "
                                       f"where >= {cfg.select_precision} of them are right",
                               "data": cfg.select_data, "examples": cfg.select_limit, **selected}
    if cfg.adapter:
        meta = with_history(meta, _read_meta(Path(cfg.adapter)))
    if cfg.method == "lora":
        model.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out / "model", safe_serialization=True)
        tok.save_pretrained(out / "model")
        (out / "model" / MARS_META).write_text(json.dumps(meta, indent=2))
    (out / MARS_META).write_text(json.dumps(meta, indent=2))


def _read_meta(folder: Path) -> dict | None:
    from mars.models.loading import MARS_META

    try:
        return json.loads((folder / MARS_META).read_text())
    except (OSError, ValueError):
        return None


def with_history(meta: dict, parent: dict | None) -> dict:
    """A continued run's metadata with its ancestry: `history` lists every earlier piece (oldest first) and
    `total` sums steps, sequences, seconds and CPU-seconds over all pieces, this one included.

    Why: a checkpoint trained "in resumable pieces across working days" must say what it cost in all.
    """
    def piece(m: dict) -> dict:
        rec = m.get("recipe", {})
        procs = m.get("processes", 1)
        return {"steps": m["steps"], "sequences": m["sequences"], "train_seconds": m["train_seconds"],
                # measured CPU time where recorded (runs sharing cores), else wall time x processes x threads
                "cpu_seconds": round(m["train_cpu_seconds"] * procs if m.get("train_cpu_seconds")
                                     else m["train_seconds"] * procs * max(1, rec.get("threads") or 1), 1),
                "processes": procs, "lr": rec.get("lr"), "data": m.get("data")}

    history = []
    if parent is not None:
        history = list(parent.get("history", [])) + [piece(parent)]
    pieces = history + [piece(meta)]
    total = {k: round(sum(x[k] for x in pieces), 1) for k in ("steps", "sequences", "train_seconds", "cpu_seconds")}
    return {**meta, "history": history, "total": total}
