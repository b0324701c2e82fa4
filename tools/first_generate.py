"""The first Generate after a fresh start against the next two, through the app's handler (no browser, no server):
time to the first group (wall and process CPU seconds), the whole run, and the race. Started as `python app.py`
starts (with the start-up rehearsal, or `none`: without it). One start per call; alternate the variants:

    for v in none rehearsal none rehearsal; do python -m tools.first_generate $v | grep RESULT; done
"""

import json
import statistics  # noqa: F401
import sys
import time


def main():
    variant = sys.argv[1] if len(sys.argv) > 1 else "rehearsal"
    t0 = time.perf_counter()
    import app
    from mars.app.session import Session
    from mars.app.inputs import MODE_LABELS, mode_block
    demo = app.create_demo()
    ma = demo.mars_app
    if variant == "none":
        ma.holder.rehearsal = None
    ma.holder.start()
    lm = ma.holder.get()
    ready = time.perf_counter() - t0
    time.sleep(5)
    prompts = ["Write a Python function that checks whether a word is an isogram.",
               "Explain why the sky is blue in two sentences, for a child.",
               "Write a Python function that checks whether a word is an isogram."]
    rows = []
    for visit, prompt in enumerate(prompts):
        session = Session()
        block = mode_block(MODE_LABELS[ma.ui.mode.value], lm)
        c0, t = time.process_time(), time.perf_counter(); first = first_cpu = None
        for upd in ma.generate(prompt, ma.ui.tau.value, block, 128, "prob", True, ma.ui.mode.value, session, ma.ui.tree_nodes.value):
            if first is None and session.mars is not None and session.mars.steps:
                first, first_cpu = time.perf_counter() - t, time.process_time() - c0
        total, cpu = time.perf_counter() - t, time.process_time() - c0
        m, a = session.mars, session.ar
        rows.append({"visit": visit + 1, "first_group_s": first, "first_group_cpu_s": first_cpu, "wall_s": total, "cpu_s": cpu,
                     "race": (a.decode_seconds / a.tokens) / (m.decode_seconds / m.tokens),
                     "mars_first_pass_ms": 1000 * m.steps[0].seconds, "ar_first_pass_ms": 1000 * a.steps[0].seconds})
        session.close()
    print("RESULT " + json.dumps({"variant": variant, "ready_s": ready, "start_up": ma.holder.start_up, "rows": rows}))


if __name__ == "__main__":
    main()
