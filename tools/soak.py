"""Memory over many consecutive runs: the app's Generate handler, in this process, N times in a row.

    python -m tools.soak                      # the default model (or MARS_MODEL), 50 runs
    python -m tools.soak --runs 50 --max-new-tokens 16 --compare

Each run is what a visitor's Generate does (MARS, then the AR comparison with --compare, the charts, the
inspector, the download files). Prints the process RSS after a few warm-up runs and after the N runs;
tests/test_app_robust.py asserts the same with the tiny model.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warm-up", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--compare", action="store_true", help="also run the AR comparison after each run")
    ap.add_argument("--mode", default="MARS (tau rule)", help='or "Verified (lossless)"')
    args = ap.parse_args(argv)

    import torch

    import app
    from mars import settings

    torch.set_num_threads(settings.get().threads or 1)  # one thread unless MARS_THREADS says otherwise
    from mars.app.session import Session

    prompts = [e["prompt"] for e in json.loads((ROOT / "assets" / "examples.json").read_text())]
    ui = app.create_demo().mars_app
    ui.holder.get()
    session = Session()

    def one(i):
        for _ in ui.generate(prompts[i % len(prompts)], 0.9, 4, args.max_new_tokens, "prob", args.compare,
                             args.mode, session):
            pass

    for i in range(args.warm_up):
        one(i)
    gc.collect()
    before, t0 = rss_mb(), time.perf_counter()
    for i in range(args.runs):
        one(i)
    gc.collect()
    after = rss_mb()
    session.close()
    print(f"model {ui.holder.loaded.name}: {args.runs} runs ({args.mode}, max_new_tokens {args.max_new_tokens}, "
          f"compare {args.compare}) in {time.perf_counter() - t0:.1f} s; "
          f"RSS {before:.1f} MB -> {after:.1f} MB ({after - before:+.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
