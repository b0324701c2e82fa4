"""The first visitor after a start against the ones after: time to the first group and the race, in the browser.

Each round starts the app fresh in a child process, as `python app.py` does (the model loads, warms up and,
unless `--no-rehearsal`, rehearses the first Generate in the background), waits `--after` seconds from the
launch, then drives headless Chromium (tools.race's page steps): visitor 1 presses Generate at the page's
defaults, then visitors 2.. (each a fresh page, the same prompt) do the same. Each visitor's time from the click
to the first coloured group, in the page's clock, and its race (MARS's speed over AR's from the trace download).
The variants alternate round by round (`--variants rehearsal none`), so a change in the machine's load falls
on both.

    python -m tools.first_visitor --rounds 2 --after 45 --json runs/first_visitor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_start(rehearsal: bool, after: float, visitors: int, prompt: str, max_new: int | None = None) -> dict:
    """In this process: the app started fresh, then `visitors` visitors one after another."""
    from playwright.sync_api import sync_playwright

    import app
    from mars.app.serving import free_port
    from tools.race import (ARGS, CHROMIUM, finish_generate, first_group_s, open_page, race_row, set_max_new, speed,
                            start_generate)

    t0 = time.perf_counter()
    demo = app.create_demo()
    holder = demo.mars_app.holder
    if not rehearsal:
        holder.rehearsal = None  # what the app did before: the load's short warm-up only
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        holder.get()  # waits for the start-up (load, warm-up and the rehearsal when on)
        ready_s = time.perf_counter() - t0
        time.sleep(max(0.0, after - (time.perf_counter() - t0)))
        for v in range(visitors):
            page, box = open_page(browser, f"http://127.0.0.1:{port}/")
            if max_new:
                set_max_new(page, box, max_new)
            start_generate(page, prompt)
            first = first_group_s(page)
            row = race_row(finish_generate(page))
            row |= {"visitor": v + 1, "first_group_s": first,
                    "race": speed(row["mars_tokens"], row["mars_s"], row["ar_tokens"], row["ar_s"])}
            rows.append(row)
            page.context.close()
        browser.close()
    demo.close()
    return {"rehearsal": rehearsal, "ready_s": ready_s, "start_up": holder.start_up, "visitors": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--after", type=float, default=45.0, help="seconds from the launch to the first visitor")
    ap.add_argument("--visitors", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["none", "rehearsal"], choices=["none", "rehearsal"])
    ap.add_argument("--max-new-tokens", type=int, default=None, help="the page's slider (default: as the page opens)")
    ap.add_argument("--prompt", default="Write a Python function that checks whether a word is an isogram.")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=["none", "rehearsal"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:  # one fresh start, its result as JSON on the last line
        result = one_start(args.child == "rehearsal", args.after, args.visitors, args.prompt, args.max_new_tokens)
        print("RESULT " + json.dumps(result))
        return 0

    results = []
    for r in range(args.rounds):
        for variant in args.variants:
            cmd = [sys.executable, "-m", "tools.first_visitor", "--child", variant, "--after", str(args.after),
                   "--visitors", str(args.visitors), "--prompt", args.prompt]
            cmd += ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ.copy())
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"round {r} ({variant}) failed")
            res = json.loads(line[len("RESULT "):]) | {"round": r, "variant": variant}
            results.append(res)
            su = res["start_up"]
            print(f"round {r} {variant:>9}: ready after {res['ready_s']:.1f} s (load {su.get('load_s', 0):.1f}, "
                  f"warm-up {su.get('warm_up_s', 0):.1f}, rehearsal {su.get('rehearsal_s', 0):.1f})", flush=True)
            for v in res["visitors"]:
                print(f"    visitor {v['visitor']}: first group {v['first_group_s']:.3f} s, race {v['race']:.2f}x "
                      f"(MARS {v['mars_tokens']} tokens {v['mars_s']:.2f} s, AR {v['ar_tokens']} tokens "
                      f"{v['ar_s']:.2f} s)", flush=True)
    print("\nmedians over rounds:")
    for variant in args.variants:
        mine = [r for r in results if r["variant"] == variant]
        for v in range(args.visitors):
            rows = [r["visitors"][v] for r in mine]
            print(f"  {variant:>9} visitor {v + 1}: first group "
                  f"{statistics.median(x['first_group_s'] for x in rows):.3f} s, race "
                  f"{statistics.median(x['race'] for x in rows):.2f}x  ({len(rows)} rounds)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
