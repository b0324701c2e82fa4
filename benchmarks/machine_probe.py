"""Is this machine's compute steady right now? The int8 C product alone, at one and two threads, round by round.

A shared 2-core machine (a VM whose cores are a host's hyperthreads) can lose half of a core's throughput to a
neighbour, for seconds or for a whole run, and its second OpenMP thread can then add nothing. Every speed
figure of this project is a ratio measured side by side in one run, but whether 2 threads helped at all
decides what such a ratio means (a compute-bound pass suffers, a memory-bound one hardly). This probe times
the int8 product of the default model's widest matrix shape (gate and up: 3072 x 576) on random 7-bit
weights, at 1 row (a weight stream, from the L3 cache) and at 16 rows (compute), with 1 and 2 threads,
the four interleaved round by round, and prints each one's multiply-adds per second (median, min, max over
rounds) and what the second thread added.

    python -m benchmarks.machine_probe                     # ~10 s
    python -m benchmarks.machine_probe --rounds 30 --json probe.json

`reading()` is the short form other benchmarks record before and after their timing (`--probe`).

No model is loaded; it needs the C kernels (a C compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch


def probe(rounds: int, calls: int, rows=(1, 16), threads=(1, 2), m: int = 3072, k: int = 576) -> dict:
    """{(threads, rows): [multiply-adds per second of each round]}: each round times `calls` products per case."""
    from mars.runtime import kernels as K

    lib = K.kernels()
    if lib is None:
        raise SystemExit(f"the C kernels are not available here: {K.unavailable_reason()}")
    g = torch.Generator().manual_seed(0)
    w, wsum = K.block_weights(lib, torch.randint(-64, 64, (m, k), dtype=torch.int8, generator=g))
    sw = torch.rand(m, generator=g)
    cases = {n: (K.quant_rows(lib, torch.randn(n, k, generator=g)), torch.empty(n, m)) for n in rows}
    out = {(t, n): [] for t in threads for n in rows}
    before = torch.get_num_threads()
    try:
        for r in range(rounds + 1):  # round 0 warms up
            order = list(out) if r % 2 else list(out)[::-1]  # alternate who goes first
            for t, n in order:
                torch.set_num_threads(t)
                xq, y = cases[n]
                K.gemv_rows(lib, xq, w, wsum, sw, None, out=y)
                t0 = time.perf_counter()
                for _ in range(calls):
                    K.gemv_rows(lib, xq, w, wsum, sw, None, out=y)
                dt = (time.perf_counter() - t0) / calls
                if r:
                    out[(t, n)].append(n * m * k / dt)
    finally:
        torch.set_num_threads(before)
    return out


def add_flag(ap: argparse.ArgumentParser) -> None:
    """Another benchmark's --probe: a reading before and after its timing."""
    ap.add_argument("--probe", action="store_true",
                    help="read benchmarks.machine_probe before and after (~3 s each): were both cores this run's?")


def reading(rounds: int = 3, calls: int = 30) -> dict:
    """A short probe (~3 s) for another benchmark's record, before and after its timing: the medians in GMAC/s
    and what the second thread added at 16 rows ({"unavailable": why} without the C kernels). The thread count
    is left as it was."""
    from mars.runtime import kernels as K

    if K.kernels() is None:
        return {"unavailable": K.unavailable_reason()}
    got = probe(rounds, calls)
    med = {f"{t} threads, {n} rows": round(statistics.median(v) / 1e9, 1) for (t, n), v in got.items()}
    return {"gmac_per_s": med, "second_thread_gain_16_rows":
            round(statistics.median(got[(2, 16)]) / statistics.median(got[(1, 16)]), 2)}


def reading_line(r: dict) -> str:
    if "unavailable" in r:
        return f"no probe: {r['unavailable']}"
    m = r["gmac_per_s"]
    return (f"int8 product {m['1 threads, 16 rows']} GMAC/s at 1 thread, {m['2 threads, 16 rows']} at 2 "
            f"(the second thread x{r['second_thread_gain_16_rows']:.2f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--calls", type=int, default=100, help="products timed together in a round")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        raise SystemExit("--rounds and --calls must be at least 1")
    load = os.getloadavg()[0]
    got = probe(args.rounds, args.calls)
    print(f"int8 product, 3072 x 576, GMAC/s over {args.rounds} rounds (median, min-max); load average {load:.1f}")
    print(f"{'threads':>8} {'rows':>5} {'median':>8} {'range':>14}")
    for (t, n), v in got.items():
        print(f"{t:>8} {n:>5} {statistics.median(v) / 1e9:>8.1f} {min(v) / 1e9:>6.1f}-{max(v) / 1e9:<6.1f}")
    gain = {n: statistics.median(got[(2, n)]) / statistics.median(got[(1, n)]) for n in (1, 16)}
    print(f"the second thread: x{gain[16]:.2f} at 16 rows (compute), x{gain[1]:.2f} at 1 row (a weight stream); "
          "(about x2 at 16 rows when both cores are this process's; x1 when a neighbour on the host holds half of "
          "them; below x1 when other processes here want the cores too: see the load average)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loadavg_before": load, "gmac_per_s": {f"{t} threads, {n} rows": [x / 1e9 for x in v] for (t, n), v in got.items()},
                       "second_thread_gain": {f"{n} rows": x for n, x in gain.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
