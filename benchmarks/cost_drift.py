"""The app's warm-up measurement of pass costs (mars.decoding.costs.measure_pass_costs), repeated: how much does what a
wider pass costs move on this machine from one measurement to the next?

The app measures at warm-up (~0.8 s), and again when the passes its visitors run drift from the table or it
ages (mars.app.cost_keeper, mars.decoding.costs.DriftRule); every tree's cut follows the current table
(DecodeConfig.pass_costs). Loads the model as the app does (MARS_MODEL / MARS_ADAPTER, MARS_BACKEND), runs
the measurement on the app's model thread `--repeat` times, `--every` seconds apart, and prints each table's
slope (what one more input adds, relative to a pass of one), a pass of 4 and 8 inputs, and the mask group's
cost; then the spread of the slopes.

    python -m benchmarks.cost_drift --repeat 30 --every 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between measurements")
    ap.add_argument("--json", help="write every table here")
    args = ap.parse_args(argv)

    import torch

    from mars.app.inputs import app_backend
    from mars.runtime.backends import resolve_backend
    from mars.app.serving import ModelHolder
    from mars.decoding.costs import measure_pass_costs

    holder = ModelHolder()
    lm = holder.get()  # loaded and warmed up as the app does
    backend = resolve_backend(lm.model, app_backend())  # "auto-int8" -> what runs here

    def measure():
        torch.set_num_threads(holder.threads)
        return measure_pass_costs(lm, backend)

    rows, t0 = [], time.perf_counter()
    print(f"{lm.name} on {backend}, {holder.threads} threads")
    for _ in range(args.repeat):
        c = holder.pass_slot.run(measure)
        rows.append({"t": time.perf_counter() - t0, "by_width": c.by_width, "group": c.group})
        print(f"{rows[-1]['t']:6.1f} s  slope {c.by_width[1] - c.by_width[0]:.3f}  4 inputs {c.by_width[3]:.2f}  "
              f"8 inputs {c.by_width[7]:.2f}  mask group +{c.group:.3f}", flush=True)
        time.sleep(args.every)
    slopes = sorted(r["by_width"][1] - r["by_width"][0] for r in rows)
    print(f"slope over {len(rows)} measurements: min {slopes[0]:.3f}, median {statistics.median(slopes):.3f}, "
          f"max {slopes[-1]:.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": lm.name, "backend": backend, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
