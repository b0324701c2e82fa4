"""Cost of one training micro-step (forward + backward) per layout: what the gated adapter's no-gradient
clean copy saves.

  standard   the paper's layout: one forward over [clean | noisy], both streams trained (`forward_batch`)
  gated-one  the gated adapter in the same one-forward layout: the clean rows carry no adapter, but the
             backward pass still runs through them (they are in the same tensors as the noisy rows)
  gated      the gated adapter as `python -m mars train --gated` runs it (`gated_forward`): the clean copy
             once without gradient, its keys and values handed to a differentiated noisy-copy forward
  gated-bf16 the same under `train --autocast bfloat16` (the forward's matmuls in bfloat16); only where
             this CPU has oneDNN's bfloat16 path

Same micro-batches (real training examples at the arms' settings), layouts interleaved round by round in
one process so a background load falls on all alike; medians and ratios to `standard` are printed.

    python -m benchmarks.step_cost --threads 1 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/selfdistill/train.jsonl.gz")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None, help="Hub id or folder (default: the embedded SmolLM2-135M-Instruct)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from peft import LoraConfig, get_peft_model

    from mars.models.gated import gate_peft_model
    from mars.models.loading import load
    from mars.training.data import load_examples
    from mars.training.objective import build_batch, forward_batch, gated_forward, mars_loss, noisy_loss
    from mars.training.train import LORA_TARGETS

    lm = load(args.model, adapter="none")
    eos = lm.eos_token_ids[0]
    examples = load_examples(args.data, lm.tokenizer, eos, args.max_length)[: args.rounds * args.batch_size]
    batches = [build_batch(examples[i:i + args.batch_size], args.block_size, lm.mask_token_id, eos, args.max_length,
                           skip_last_slot=True) for i in range(0, len(examples), args.batch_size)]
    lcfg = dict(r=16, lora_alpha=32, target_modules=list(LORA_TARGETS))
    plain = get_peft_model(lm.model, LoraConfig(**lcfg))
    gated = get_peft_model(load(args.model, adapter="none").model, LoraConfig(**lcfg))
    gate_peft_model(gated, lm.mask_token_id)
    for m in (plain, gated):
        m.train()

    def standard(b):
        return mars_loss(forward_batch(plain, b), b)["loss"]

    def gated_one(b):
        return noisy_loss(forward_batch(gated, b)[:, b.clean_len:], b)["loss"]

    def gated_two(b):
        return noisy_loss(gated_forward(gated, b, gated.disable_adapter()), b)["loss"]

    layouts = {"standard": standard, "gated-one": gated_one, "gated": gated_two}
    from mars.runtime.cpu import bf16_unsupported_reason

    if bf16_unsupported_reason() is None:
        from mars.training.train import autocast_context

        amp = autocast_context("bfloat16", "cpu")

        def gated_bf16(b):
            with amp():
                return gated_two(b)

        layouts["gated-bf16"] = gated_bf16
    times = {k: [] for k in layouts}
    for b in batches[:1]:  # warm-up
        for f in layouts.values():
            f(b).backward()
    for r, b in enumerate(batches):
        for name, f in layouts.items():
            t = time.perf_counter()
            f(b).backward()
            times[name].append(time.perf_counter() - t)
        print(f"round {r + 1}/{len(batches)}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = [int(b.input_ids.numel()) for b in batches]
    print(json.dumps({"threads": args.threads, "rounds": len(batches), "tokens_per_micro_batch": statistics.median(tokens),
                      "median_seconds": {k: round(v, 3) for k, v in med.items()},
                      "ratio_to_standard": {k: round(v / med["standard"], 3) for k, v in med.items()}}))


if __name__ == "__main__":
    main()
