"""Which SDPA kernels can run the training forward ([clean | noisy] with its 4D mask), on this device.

transformers runs SmolLM2 with attn_implementation "sdpa"; with an explicit mask it repeats the 3 KV heads
to 9 and hands SDPA a float mask (GQA in SDPA needs no mask). Flash attention takes no arbitrary mask, so on
CUDA the mask-aware memory-efficient kernel is the one that can run it: this checks each kernel alone.

    python -m benchmarks.sdpa_probe --device cuda [--model DIR] [--batch 4] [--max-length 256]
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mars.models.loading import load
    from mars.training.data import read_jsonl, to_example
    from mars.training.objective import build_batch, forward_batch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None)
    ap.add_argument("--data", default="data/selfdistill/heldout.jsonl.gz")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args(argv)
    lm = load(args.model, "none", device=args.device, dtype="float32")
    device = lm.model.device
    eos = lm.eos_token_ids[0]
    examples = [to_example(r, lm.tokenizer, eos) for r in read_jsonl(args.data)[: args.batch]]
    batch = build_batch(examples, 4, lm.mask_token_id, eos, args.max_length).to(device)
    result = {"device": str(device), "attn_implementation": lm.model.config._attn_implementation,
              "shape": list(batch.input_ids.shape), "kernels": {}}
    for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("math", SDPBackend.MATH)):
        try:
            with torch.no_grad(), sdpa_kernel([kernel]), torch.autocast(device.type, dtype=torch.bfloat16):
                forward_batch(lm.model, batch)
            result["kernels"][name] = "runs"
        except RuntimeError as e:
            result["kernels"][name] = "refused: " + (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
