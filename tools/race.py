"""The app's race against the bench's, on the same prompts, in one process: does the app show MARS's real speed?

1. Starts the app in-process (default model + shipped adapter, or MARS_MODEL / MARS_ADAPTER) on a free port and
   waits for the model to load.
2. Drives headless Chromium through the prompts at the app's defaults (mode, tau and B, the AR race on), one
   after another, and reads each race from the trace JSON download (#download-json): MARS and AR decode
   seconds, tokens, passes, median pass ms.
3. Two visitors at once: two pages press Generate together; each one's time to its first group, and the
   order in which the server ran their passes (a wrapper on the holder's passes records the worker thread).
4. Runs the same prompts the bench's way (`mars.decoding.decoder.generate_ids`, the bench's core path) on the same
   thread count, the app's default mode and tau then ar, and prints app vs bench side by side.

`--chart-every 1.0 inf` repeats step 2 once per chart interval (the app's MARS_CHART_EVERY_S: seconds between
chart redraws while a run streams; inf = charts only at the end), prompt by prompt in turn, to see whether the
page's updates slow the passes; `--text-every 0.1 0.25` likewise per text interval (MARS_TEXT_EVERY_S: seconds
between updates of the coloured text). `--handler` adds the app's generate handler run in-process without server or
page. Every variant runs on each prompt before the next prompt, so a change in the machine's load falls on all.

    python -m tools.race                        # 3 held-out prompts, 64 new tokens
    python -m tools.race --limit 5 --max-new-tokens 128 --json runs/race.json
    python -m tools.race --chart-every 1.0 0.5 inf --no-visitors --no-bench
    python -m tools.race --browser-nice 19     # the browser yields the cores, as a remote one would
    python -m tools.race --browser-idle        # it draws only on an idle core (SCHED_IDLE)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def niced(executable: str, nice: int, idle: bool = False) -> str:
    """The browser to launch: `executable` itself, or a wrapper that starts it (and so its renderers) at this
    niceness, or (idle) under SCHED_IDLE: it runs only on a core nothing else wants. The page is drawn on the
    server's two cores here; a visitor's browser draws on their own."""
    if not nice and not idle:
        return executable
    import tempfile

    wrapper = Path(tempfile.mkdtemp(prefix="race-browser-")) / "chromium"
    launch = f"chrt --idle 0 {executable}" if idle else f"nice -n {int(nice)} {executable}"
    wrapper.write_text(f'#!/bin/sh\nexec {launch} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def median_ms(seconds: list[float]) -> float:
    return 1000 * statistics.median(seconds) if seconds else float("nan")


class PassLog:
    """Wraps the holder's `passes`: (run, end time, mode, worker thread) of every pass the server runs. A run
    is one visitor's generation (its DecodeControl); the thread is whichever of Gradio's workers ran the pass."""

    def __init__(self, holder):
        self.events: list[tuple[int, float, str, int]] = []
        self._lock = threading.Lock()
        inner = holder.passes

        def passes(lm, prompt_ids, cfg, control):
            for rec in inner(lm, prompt_ids, cfg, control):
                with self._lock:
                    self.events.append((id(control), time.perf_counter(), cfg.mode, threading.get_ident()))
                yield rec

        holder.passes = passes

    def since(self, t0: float) -> list[tuple[int, float, str, int]]:
        with self._lock:
            return [e for e in self.events if e[1] >= t0]


# ------------------------------------------------------------------------------------------------- the app
def start_app():
    import app

    from mars.app.serving import free_port

    demo = app.create_demo()
    log = PassLog(demo.mars_app.holder)
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    lm = demo.mars_app.holder.get()  # waits for the start-up load and warm-up
    return app, demo, lm, log, f"http://127.0.0.1:{port}/"


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # its own context: its own session
    page.goto(url)
    page.wait_for_selector("#prompt textarea", timeout=60_000)
    page.wait_for_selector("#model-banner b", timeout=300_000)  # the model panel has filled in
    box = page.locator("#max-new-tokens input[type=number]")
    return page, box


def set_max_new(page, box, n: int):
    box.fill(str(n))
    box.press("Enter")


# Stamps, in the page's own clock, the click on Generate and the moment the first coloured group is in the DOM
# (a MutationObserver's callback runs before the next paint). Timed from this script instead, a visitor's time
# included whatever the script did on another page in between: with two pages, the first page's figure
# included the second page's clear, fill and click (1.7 s against 0.3 s in one run at eff7fe9).
FIRST_GROUP_JS = """() => {
  window.__marsClick = null;
  window.__marsFirst = null;
  document.querySelector('#generate').addEventListener(
    'click', () => { window.__marsClick = performance.now(); }, {once: true, capture: true});
  const obs = new MutationObserver(() => {
    if (window.__marsFirst === null && document.querySelector('#output .mars-group') !== null) {
      window.__marsFirst = performance.now();
      obs.disconnect();
    }
  });
  obs.observe(document.body, {childList: true, subtree: true});
}"""


# Resolves once the page's main thread has been idle for two whole idle periods in a row (requestIdleCallback
# with the full 50 ms left), or after 5 s. Clear redraws the three charts (plotly: ~0.2-0.4 s of a core here),
# and the last run's final update draws them too; the script typed the next prompt and pressed Generate while
# that drawing still ran, so the browser's work fell on MARS's first passes (its first 5 passes took 25-63 ms
# in the browser at c721167, 7-10 ms without a page). A visitor takes longer than that to type a prompt.
SETTLE_JS = """() => new Promise(resolve => {
  const t0 = performance.now();
  let quiet = 0;
  const step = (deadline) => {
    quiet = deadline.timeRemaining() >= 45 ? quiet + 1 : 0;
    if (quiet >= 2 || performance.now() - t0 > 5000) resolve(performance.now() - t0);
    else requestIdleCallback(step, {timeout: 500});
  };
  requestIdleCallback(step, {timeout: 500});
})"""


def prepare_generate(page, prompt: str):
    """Clear the page, type the prompt, wait until the page has drawn what Clear sent (SETTLE_JS), and set the
    page to stamp its click and first group (FIRST_GROUP_JS)."""
    page.click("#clear")
    page.wait_for_function("document.querySelectorAll('#output .mars-group').length === 0", timeout=30_000)
    page.fill("#prompt textarea", prompt)
    page.evaluate(SETTLE_JS)
    page.evaluate(FIRST_GROUP_JS)


def start_generate(page, prompt: str):
    """prepare_generate, then press Generate."""
    prepare_generate(page, prompt)
    page.click("#generate")


def first_group_s(page, timeout_s: float = 300) -> float:
    """Seconds from the click on Generate to the first coloured group, in the page's clock (FIRST_GROUP_JS)."""
    page.wait_for_function("window.__marsFirst !== null && window.__marsClick !== null", timeout=timeout_s * 1000)
    return page.evaluate("(window.__marsFirst - window.__marsClick) / 1000")


def finish_generate(page, timeout_s: float = 900) -> dict:
    """Wait for the run (MARS then AR) to end, then download and read its trace JSON."""
    page.wait_for_selector('#stats [data-state="done"]', timeout=timeout_s * 1000)
    button = page.locator("#download-json")
    page.wait_for_function("!document.querySelector('#download-json').disabled", timeout=30_000)
    with page.expect_download(timeout=60_000) as info:
        button.click()
    return json.loads(Path(info.value.path()).read_text())


def race_row(trace: dict) -> dict:
    m, a = trace["mars"], trace["ar"] or {}
    row = {"mars_tokens": m["tokens"], "mars_passes": m["passes"], "mars_s": m["decode_seconds"],
           "mars_pass_ms": median_ms([p["seconds"] for p in m["steps"]]),
           "ar_tokens": a.get("tokens", 0), "ar_passes": a.get("passes", 0), "ar_s": a.get("decode_seconds", 0.0),
           "ar_pass_ms": median_ms([p["seconds"] for p in a.get("steps", [])])}
    return row


def speed(mars_tokens, mars_s, ar_tokens, ar_s) -> float:
    """MARS's speed over AR's, per token of decode time (the app's speed-up tile)."""
    if not (mars_s and ar_s and mars_tokens and ar_tokens):
        return float("nan")
    return (ar_s / ar_tokens) / (mars_s / mars_tokens)


def summarise(rows: list[dict]) -> dict:
    s = lambda k: sum(r[k] for r in rows)  # noqa: E731
    return {"ratio": speed(s("mars_tokens"), s("mars_s"), s("ar_tokens"), s("ar_s")),
            "mars_pass_ms": statistics.median([r["mars_pass_ms"] for r in rows]),
            "ar_pass_ms": statistics.median([r["ar_pass_ms"] for r in rows]),
            "mars_tokens": s("mars_tokens"), "ar_tokens": s("ar_tokens"),
            "mars_passes": s("mars_passes"), "ar_passes": s("ar_passes"),
            "first_group_s": max((r["first_group_s"] for r in rows if "first_group_s" in r), default=None)}


def browser_races(demo, page, box, prompts, max_new: int, chart_every: list[float], text_every: list[float],
                  others) -> dict[str, list[dict]]:
    """Each prompt, under each chart interval and text interval in turn, then each of `others` (name ->
    run(prompt) -> row) on it: interleaved prompt by prompt, so a change in the machine's load falls on all of
    them alike."""
    set_max_new(page, box, max_new)
    variants = {(f"app (charts/{c}s)" if len(text_every) == 1 else f"app (charts/{c}s, text/{t}s)"): (c, t)
                for c in chart_every for t in text_every}
    out: dict[str, list[dict]] = {name: [] for name in variants} | {name: [] for name in others}
    for i, prompt in enumerate(prompts):
        for name, run in others.items():
            row = run(prompt) | {"prompt": i}
            out[name].append(row)
            print(f"  {name} prompt {i}: {fmt_row(row)}", flush=True)
        for name, (c, t) in variants.items():
            demo.mars_app.chart_every_s, demo.mars_app.text_every_s = c, t
            start_generate(page, prompt)
            first = first_group_s(page)
            row = race_row(finish_generate(page)) | {"prompt": i, "first_group_s": first}
            out[name].append(row)
            print(f"  {name} prompt {i}: {fmt_row(row)}", flush=True)
    return out


def fmt_row(row: dict) -> str:
    first = f"first group {row['first_group_s']:.2f} s; " if "first_group_s" in row else ""
    return first + (f"MARS {row['mars_tokens']} tok {row['mars_passes']} passes {row['mars_s']:.2f} s "
            f"({row['mars_pass_ms']:.0f} ms/pass) | AR {row['ar_tokens']} tok {row['ar_s']:.2f} s "
            f"({row['ar_pass_ms']:.0f} ms/pass) -> {speed(row['mars_tokens'], row['mars_s'], row['ar_tokens'], row['ar_s']):.2f}x")


def two_visitors(browser, url, log: PassLog, prompts, max_new: int) -> dict:
    """Two pages press Generate together: each one's time to its first group, and the server's pass order."""
    pages = [open_page(browser, url) for _ in range(2)]
    for (page, box) in pages:
        set_max_new(page, box, max_new)
    for i, (page, _) in enumerate(pages):
        prepare_generate(page, prompts[i % len(prompts)])
    t_start = time.perf_counter()
    for page, _ in pages:  # both clicks together (a page in the background settles late: its idle callbacks wait)
        page.click("#generate")
    firsts = [first_group_s(page) for page, _ in pages]
    traces = [finish_generate(page) for page, _ in pages]
    events = log.since(t_start)
    threads = list(dict.fromkeys(e[0] for e in events))  # the runs (visitors), in order of their first pass
    order = "".join("AB"[threads.index(e[0])] if threads.index(e[0]) < 2 else "?" for e in events)
    # the longest run of one visitor's passes while the other still had passes to come
    last = {v: order.rfind(v) for v in "AB"}
    first = {v: order.find(v) for v in "AB"}
    overlap = order[max(first.values()):min(last.values()) + 1]
    longest = max((len(run) for run in _runs(overlap)), default=0)
    for page, _ in pages:
        page.context.close()
    workers = [len({e[3] for e in events if e[0] == run}) for run in threads[:2]]
    return {"first_group_s": firsts, "pass_order": order, "first_pass_index": first, "worker_threads": workers,
            "longest_streak_while_both_ran": longest,
            "passes_before_second_visitor": max(first.values()),
            "ratios": [summarise([race_row(t)])["ratio"] for t in traces]}


def _runs(s: str) -> list[str]:
    out, cur = [], ""
    for ch in s:
        if cur and ch != cur[-1]:
            out.append(cur)
            cur = ""
        cur += ch
    return out + ([cur] if cur else [])


def handler_race(demo, prompt: str, max_new: int) -> dict:
    """The app's own generate handler at its defaults, consumed in this thread: no server, no browser. What the
    app's passes cost without the page's updates being sent and drawn."""
    from mars.app.inputs import MODE_LABELS, mode_block
    from mars.app.session import Session

    ma = demo.mars_app
    session = Session()
    block = mode_block(MODE_LABELS[ma.ui.mode.value], ma.holder.get())  # as the page sets its slider
    for _ in ma.generate(prompt, ma.ui.tau.value, block, max_new, "prob", True, ma.ui.mode.value, session,
                         ma.ui.tree_nodes.value):
        pass
    m, a = session.mars, session.ar
    return {"mars_tokens": m.tokens, "mars_passes": m.passes, "mars_s": m.decode_seconds,
            "mars_pass_ms": median_ms([r.seconds for r in m.steps]),
            "ar_tokens": a.tokens, "ar_passes": a.passes, "ar_s": a.decode_seconds,
            "ar_pass_ms": median_ms([r.seconds for r in a.steps])}


# ------------------------------------------------------------------------------------------------ the bench
def bench_race(lm, prompt: str, max_new: int, threads: int) -> dict:
    """The bench's core path (`generate_ids`, batch 1) in this thread, the app's default mode and tau (its own
    config builder, `make_config`) then ar, on `threads` threads, on the app's backend (MARS_BACKEND; int8 by
    default on a CPU), so that app and bench run the same model and setting."""
    import torch

    from mars.app.inputs import (DEFAULT_MODE_LABEL, MODE_LABELS, MODE_TAU, app_tree_nodes, fit_to_model, make_config,
                                 mode_block)
    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids

    torch.set_num_threads(threads)
    ids = encode_prompt(lm.tokenizer, prompt)
    mode = MODE_LABELS[DEFAULT_MODE_LABEL]
    cfg, _ = fit_to_model(lm, make_config(mode, MODE_TAU[mode], mode_block(mode, lm), max_new, top_k=0,
                                          tree_nodes=app_tree_nodes()))  # as the app's generate does
    m = generate_ids(lm, [ids], cfg)[0]
    a = generate_ids(lm, [ids], DecodeConfig(mode="ar", tau=1.0, block_size=1, max_new_tokens=max_new,
                                             backend=cfg.backend))[0]
    return {"mars_tokens": m.tokens, "mars_passes": m.passes, "mars_s": m.decode_seconds,
            "mars_pass_ms": median_ms([s.seconds for s in m.steps]),
            "ar_tokens": a.tokens, "ar_passes": a.passes, "ar_s": a.decode_seconds,
            "ar_pass_ms": median_ms([s.seconds for s in a.steps])}


def table(named: dict[str, dict]) -> str:
    lines = [f"{'':<22} {'MARS/AR speed':>13} {'MARS ms/pass':>12} {'AR ms/pass':>10} {'pass ratio':>10} "
             f"{'MARS tok/passes':>15} {'AR tok':>6} {'first group (max)':>17}"]
    for name, s in named.items():
        first = "" if s.get("first_group_s") is None else f"{s['first_group_s']:.2f} s"
        lines.append(f"{name:<22} {s['ratio']:>12.2f}x {s['mars_pass_ms']:>12.1f} {s['ar_pass_ms']:>10.1f} "
                     f"{s['mars_pass_ms'] / s['ar_pass_ms']:>9.2f}x {s['mars_tokens']:>7}/{s['mars_passes']:<7} "
                     f"{s['ar_tokens']:>6} {first:>17}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=str(ROOT / "data" / "prompts" / "heldout.jsonl"))
    ap.add_argument("--limit", type=int, default=3, help="prompts, spread through the file")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--chart-every", type=float, nargs="+", default=None,
                    help="chart intervals (MARS_CHART_EVERY_S) to compare (default: the app's own); inf = charts only at the end")
    ap.add_argument("--text-every", type=float, nargs="+", default=None,
                    help="text intervals (MARS_TEXT_EVERY_S) to compare (default: the app's own)")
    ap.add_argument("--no-visitors", action="store_true", help="skip the two-visitors check")
    ap.add_argument("--no-bench", action="store_true", help="skip the bench run")
    ap.add_argument("--handler", action="store_true",
                    help="also run the app's generate handler in-process, without server or browser")
    ap.add_argument("--browser-nice", type=int, default=0,
                    help="run Chromium at this niceness (19: it yields the cores to the server, as a visitor's "
                         "browser on their own machine would; 0: it competes for them, the default)")
    ap.add_argument("--browser-idle", action="store_true",
                    help="run Chromium under SCHED_IDLE (chrt --idle): it draws only when the server leaves a core "
                         "idle, the nearest this machine comes to a visitor's browser on their own machine; its "
                         "first-group times then wait for the page too")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    from mars.evaluation.bench import read_prompts, spread_indices

    prompts = read_prompts(args.prompts)
    prompts = [prompts[i] for i in spread_indices(len(prompts), args.limit)]

    t = time.perf_counter()
    app, demo, lm, log, url = start_app()
    threads = demo.mars_app.holder.threads
    chart_every = args.chart_every or [demo.mars_app.chart_every_s]
    text_every = args.text_every or [demo.mars_app.text_every_s]
    print(f"app up at {url} in {time.perf_counter() - t:.0f} s: {lm.name}, {threads} threads per pass, "
          f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, charts every {chart_every} s, text every "
          f"{text_every} s, browser {'under SCHED_IDLE' if args.browser_idle else f'at nice {args.browser_nice}'}",
          flush=True)
    result = {"threads": threads, "max_new_tokens": args.max_new_tokens, "prompts": prompts,
              "browser_nice": args.browser_nice, "browser_idle": args.browser_idle, "text_every_s": text_every}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=niced(CHROMIUM, args.browser_nice, args.browser_idle),
                                        args=ARGS)
            others = {}
            if args.handler:
                others["app handler, no page"] = lambda p: handler_race(demo, p, args.max_new_tokens)
            if not args.no_bench:
                # on the app's model thread, as the app's own passes: a second thread running passes would slow
                # both (mars.app.model_thread)
                slot = demo.mars_app.holder.pass_slot
                others["bench"] = lambda p: slot.run(bench_race, lm, p, args.max_new_tokens, threads)
            page, box = open_page(browser, url)
            result["runs"] = browser_races(demo, page, box, prompts, args.max_new_tokens, chart_every, text_every,
                                           others)
            page.context.close()
            if not args.no_visitors:
                demo.mars_app.chart_every_s, demo.mars_app.text_every_s = chart_every[0], text_every[0]
                result["visitors"] = v = two_visitors(browser, url, log, prompts, args.max_new_tokens)
                print(f"two visitors: first group after {v['first_group_s'][0]:.2f} s and "
                      f"{v['first_group_s'][1]:.2f} s; the second's first pass was pass "
                      f"{v['passes_before_second_visitor']} of the server; longest run of one visitor's passes "
                      f"while both ran: {v['longest_streak_while_both_ran']}; Gradio worker threads per visitor "
                      f"{v['worker_threads']}; order {v['pass_order'][:80]}",
                      flush=True)
            browser.close()
    finally:
        demo.close()

    result["summary"] = named = {name: summarise(rows) for name, rows in result["runs"].items()}
    print(table(named))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=lambda x: None if math.isnan(x) else x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
