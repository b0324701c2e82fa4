"""A room in one process: R rows through the scheduler (mars.decoding.scheduler), joining a few passes apart, no
server; their aggregate tokens/s against the same rows one at a time, whether each row's tokens equal its solo
run, and the process's peak RSS (issue 53, items 4 and 9).

    python -m benchmarks.room --rows 32 --max-new-tokens 512 --prompt-tokens 512 --solo 0 --no-eos   # RSS at
                                                                                      # the cap, 1,024-token rows
    python -m benchmarks.room --rows 8 --device cuda --backend static                      # the GPU check's line

Rows are held-out prompts (data/prompts/heldout.jsonl) at the app's lossless setting on this device (verified,
its B and tree; --mode ar or mars for others), each joining `--join-every` passes after the one before. With
--prompt-tokens a prompt is repeated to that many tokens (a long row's cache, not its text, is the point).
`--solo K` runs the first K rows alone as well (the reference: exact in float32 and int8; on a GPU in bfloat16 a
wide pass and a narrow one round differently, so there it reports the agreement).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--prompt-tokens", type=int, default=0, help="repeat each prompt to this many tokens (0: as is)")
    ap.add_argument("--join-every", type=int, default=1, help="passes between two rows' arrivals (0: all at once)")
    ap.add_argument("--mode", default="verified", choices=["verified", "mars", "ar"])
    ap.add_argument("--backend", default="auto-int8")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="a model folder or Hub id (default: the embedded one, with its adapter)")
    ap.add_argument("--solo", type=int, default=4, help="rows also run alone, to compare (0: none)")
    ap.add_argument("--profile", type=int, default=0, help="print the room's N costliest functions (cProfile)")
    ap.add_argument("--no-eos", action="store_true", help="rows run to --max-new-tokens (memory at full length)")
    args = ap.parse_args(argv)
    if not 1 <= args.rows <= 256:
        ap.error("--rows must be in [1, 256]")

    from dataclasses import replace

    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.serve_load import heldout_prompts
    from mars.app.inputs import VERIFIED_CPU_BLOCK
    from mars.decoding.decoder import DecodeConfig, DecodeControl, encode_prompt, generate_ids
    from mars.decoding.scheduler import Scheduler
    from mars.decoding.tree import default_tree_nodes
    from mars.models.loading import load
    from mars.runtime.backends import resolve_backend

    t0 = time.perf_counter()
    lm = load(args.model, device=args.device) if args.model else load(device=args.device)
    backend = resolve_backend(lm.model, args.backend)
    on_cpu = args.device == "cpu"
    if args.mode == "verified":  # the app's own lossless setting: its B and tree, the datastore, this machine's costs
        from mars.app.inputs import app_datastore, app_pass_costs, fit_to_model, make_config

        app_datastore(lm)
        app_pass_costs(lm, backend)
        cfg, _ = fit_to_model(lm, make_config("verified", 0.0, VERIFIED_CPU_BLOCK if on_cpu else 4, args.max_new_tokens,
                                              top_k=0, backend=backend, tree_nodes=default_tree_nodes(args.device)))
        cfg = replace(cfg, max_new_tokens=args.max_new_tokens)
    else:
        cfg = DecodeConfig(mode=args.mode, max_new_tokens=args.max_new_tokens, backend=backend,
                           **(dict(tau=1.0, block_size=1) if args.mode == "ar" else {}))
    if args.no_eos:
        lm.model.generation_config.eos_token_id = []  # no EOS: the decoder reads its EOS ids from here
    prompts = []
    for text in heldout_prompts(args.rows):
        ids = encode_prompt(lm.tokenizer, text)
        if args.prompt_tokens:  # the question said again and again, inside one chat turn, to that many tokens
            k = 1
            while len(ids) < args.prompt_tokens:
                k += 1
                ids = encode_prompt(lm.tokenizer, " ".join([text] * k))
        prompts.append(ids)
    generate_ids(lm, [prompts[0][:8]], replace(cfg, max_new_tokens=4))  # warm the kernels
    print(f"room: {args.rows} rows of {args.mode} ({backend}, {args.device}), prompts "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.max_new_tokens} new each; "
          f"model ready in {time.perf_counter() - t0:.1f} s, RSS {peak_rss_mb():.0f} MB", flush=True)

    sched = Scheduler(lm, backend)
    got: dict[int, list[int]] = {}
    widest, longest, passes = 0, 0, 0
    row_passes, inputs = 0, 0
    t0 = time.perf_counter()
    waiting = list(enumerate(prompts))
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    while waiting or not sched.idle:
        while waiting and (args.join_every == 0 or passes % args.join_every == 0):  # 0: all at once
            i, ids = waiting.pop(0)
            sched.add(ids, cfg, DecodeControl(), index=i)
            if args.join_every:
                break
        for rec in sched.step():
            got.setdefault(rec.row, []).extend(rec.token_ids)
        passes += 1
        if sched.last is not None:
            widest = max(widest, sched.last.rows)
            row_passes += sched.last.rows
            inputs += sched.last.decode_inputs
        if sched.cache is not None:
            longest = max(longest, sched.cache.length)
    room_s = time.perf_counter() - t0
    if args.profile:
        import pstats

        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    tokens = sum(map(len, got.values()))
    print(f"room: {tokens} tokens in {room_s:.2f} s = {tokens / room_s:.1f} tokens/s; {passes} passes, up to "
          f"{widest} rows a pass, the cache at most {longest} columns; peak RSS {peak_rss_mb():.0f} MB", flush=True)
    print(f"room: per row and pass {inputs / max(1, row_passes):.2f} inputs (decoding rows), "
          f"{tokens / max(1, row_passes):.2f} tokens; {row_passes / max(1, passes):.1f} rows a pass on average",
          flush=True)
    if args.solo:
        k = min(args.solo, args.rows)
        t0 = time.perf_counter()
        alone = [generate_ids(lm, [p], cfg)[0].token_ids for p in prompts[:k]]
        solo_s = time.perf_counter() - t0
        same = sum(got[i] == a for i, a in enumerate(alone))
        solo_rate = sum(map(len, alone)) / solo_s
        print(f"solo: the first {k} rows one at a time {solo_rate:.1f} tokens/s; the room "
              f"{tokens / room_s / solo_rate:.2f}x that; rows equal to their solo run: {same}/{k}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
