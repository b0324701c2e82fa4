"""Two self-contained pieces of the app's UI, each built by one call inside an open `gr.Blocks`/`gr.Tab`:

- `build_batch_tab(get_lm, pass_slot)`: the Batch tab (the paper's Figure 4, live);
- `build_model_list(install, guard, token)`: the paper's published checkpoints in the Model tab, and the
  Model tab's texts for a public server (`model_tab_help`, `paper_links_markdown`).

They take callables instead of reaching into the app: `get_lm()` returns the shared model (raising
`gr.Error` when it cannot), `pass_slot` runs every forward pass (ModelHolder.pass_slot: the model thread),
`install(lm)` makes a loaded model the one everybody uses (e.g. ModelHolder.replace). The logic lives in
`mars.app.batch` / `mars.models.hub`, the drawing in `mars.app.batch_viz`; this file only wires components.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import gradio as gr

from mars.app import batch_viz, viz
from mars.app.batch import MAX_BATCH, measure_comparison, parse_batch_prompts, run_batch
from mars.app.errors import failure_error, visitor_error
from mars.app.model_thread import in_own_thread
from mars.app.session import TabSession
from mars.decoding.decoder import DecodeControl
from mars.models.hub import DEFAULT_CHOICE, PAPER_CHECKPOINTS, SOURCE, load_checkpoint, model_choices

CHART_EVERY_S = 1.0  # the timeline is redrawn at most this often while a batch streams (rows: every pass)
BATCH_CSS = batch_viz.BATCH_CSS + "#batch-output .mars-batch { max-height: 48em; overflow-y: auto; }\n"
# The tab's defaults. The count is copied ahead 2-4 tokens a pass where the others take 1-2, so with these settings
# it reaches cache-block ends first and idles there: the default batch shows what the tab is about (on the default
# model, int8 or float32; tests/test_batch.py checks it).
EXAMPLE_PROMPTS = "\n".join([
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Count from 1 to 20.",
    "Explain in one sentence what a KV cache is.",
])
DEFAULTS = {"tau": 0.9, "block_size": 4, "max_new_tokens": 64, "cache_block": 16}
SWITCH = "model-switch"  # the concurrency id of every event that loads a model: one load at a time
EMPTY = "One row per prompt appears here; each coloured span is one pass of the whole batch."


@dataclass
class BatchSession(TabSession):
    """One visitor's batch state (a gr.State): the running batch's control and its download files (TabSession),
    and the last batch and comparison."""

    last: dict = field(default_factory=dict)


def write_batch_files(session: BatchSession, state, comp, model: dict) -> tuple[str, str]:
    """The batch as a coloured HTML page and a JSON trace, in a fresh folder (the previous one is deleted)."""
    folder = session.new_folder("mars-batch-")
    html_path, json_path = folder / "mars-batch.html", folder / "mars-batch.json"
    name = model.get("model", "model")
    html_path.write_text(batch_viz.standalone_batch_html(state, comp, f"MARS batch of {len(state.rows)} ({name})",
                                                         summary_line(state)), encoding="utf-8")
    trace = {"model": model, "batch": state.to_dict(), "comparison": comp.to_dict() if comp else None}
    json_path.write_text(json.dumps(trace, indent=1), encoding="utf-8")
    return str(html_path), str(json_path)


def summary_line(state) -> str:
    t = state.totals
    return (f"{viz.plural(len(state.rows), 'prompt')}, {viz.plural(state.batch_passes, 'pass')} of the batch, "
            f"{viz.plural(t.tokens, 'token')} "
            f"({t.tokens_per_batch_pass:.2f} per pass), {state.idle_row_passes} row-passes idle at cache-block ends, "
            f"{t.batch_seconds:.2f} s of decoding; tau {state.settings['tau']}, B {state.settings['block_size']}, "
            f"cache block {state.settings['cache_block']}.")


def make_batch_runner(get_lm: Callable[[], object], pass_slot=None, check_prompt: Callable | None = None,
                      make_config: Callable | None = None, encode: Callable | None = None):
    """The Batch tab's run handler: a generator of (rows, timeline, comparison, html file, json file)."""
    if check_prompt is None or make_config is None or encode is None:
        from mars.app import inputs

        check_prompt = check_prompt or inputs.check_prompt
        make_config = make_config or inputs.make_config
        encode = encode or inputs.encode_checked

    def run(prompts_text, tau, block_size, max_new_tokens, cache_block, axis, session: BatchSession):
        lm = get_lm()
        try:
            prompts = parse_batch_prompts(prompts_text, check_prompt)
            if lm.mask_token_id is None:
                raise ValueError("this model has no mask token: it runs AR only, so there is no MARS batch to show")
            cfg = make_config("mars", tau, block_size, max_new_tokens, "prob", top_k=0, cache_block=cache_block)
            ids = [encode(lm, p, cfg) for p in prompts]
        except ValueError as e:
            raise visitor_error(e) from None
        session.stop()
        control = session.control = DecodeControl()
        skip = gr.update()
        last_chart, state, comp = 0.0, None, None
        try:
            backend = getattr(getattr(pass_slot, "holder", None), "backend", None)  # the app's, else by name
            for state in run_batch(lm, prompts, ids, cfg, control, pass_slot, backend):
                chart = skip
                if state.done or time.perf_counter() - last_chart > CHART_EVERY_S:
                    chart, last_chart = batch_viz.make_batch_timeline_figure(state, axis), time.perf_counter()
                yield batch_viz.render_batch_html(state), chart, batch_viz.render_comparison_html(None), skip, skip
            if not control.cancelled:
                for comp in measure_comparison(lm, state, cfg, control, pass_slot):
                    yield skip, skip, batch_viz.render_comparison_html(comp), skip, skip
        except GeneratorExit:  # the visitor left: no pass starts for nobody
            control.cancel()
            raise
        except Exception as e:  # the app keeps serving
            raise failure_error(e, "batch run failed", "The batch run failed") from None
        session.last = {"state": state, "comp": comp}
        html_path, json_path = write_batch_files(session, state, comp, lm.describe())
        comp_html = batch_viz.render_comparison_html(comp) if comp else (
            '<div class="mars-note">stopped: no comparison was run.</div>')
        yield (batch_viz.render_batch_html(state), batch_viz.make_batch_timeline_figure(state, axis), comp_html,
               gr.update(value=html_path, interactive=True), gr.update(value=json_path, interactive=True))

    return run


def build_batch_tab(get_lm: Callable[[], object], pass_slot=None, concurrency_limit: int | str | None = "default",
                    runner: Callable | None = None) -> SimpleNamespace:
    """The Batch tab's components and events; call inside `with gr.Tab("Batch"):`. Returns the components.
    Runs share the concurrency id "model" with the app's other model events (pass the app's limit).

    elem ids: batch-prompts, batch-run, batch-stop, batch-tau, batch-block-size, batch-max-new-tokens,
    batch-cache-block, batch-axis, batch-output (one .mars-row per prompt), batch-chart, batch-compare,
    batch-download-html, batch-download-json.
    """
    c = SimpleNamespace()
    session = gr.State(BatchSession(), delete_callback=BatchSession.close)
    gr.Markdown(f"Up to {MAX_BATCH} prompts decoded **as one batch** on the block-level KV cache (the paper's "
                "Figure 4). Rows accept different numbers of tokens per pass; a row that reaches the end of the "
                "current cache block **idles** (‖) until every row has filled it. Afterwards the same prompts run "
                "one at a time and as AR at the same batch size: every number below is measured.")
    with gr.Row():
        c.prompts = gr.Textbox(EXAMPLE_PROMPTS, label=f"Prompts, one per line (1 to {MAX_BATCH})", lines=5,
                               elem_id="batch-prompts", scale=3)
        with gr.Column(scale=2):
            c.tau = gr.Slider(0.0, 1.0, value=DEFAULTS["tau"], step=0.01, label="τ", elem_id="batch-tau")
            c.block = gr.Slider(1, 16, value=DEFAULTS["block_size"], step=1, label="block size B",
                                elem_id="batch-block-size")
            c.max_new = gr.Slider(8, 256, value=DEFAULTS["max_new_tokens"], step=8, label="max new tokens",
                                  elem_id="batch-max-new-tokens")
            c.cache_block = gr.Slider(4, 64, value=DEFAULTS["cache_block"], step=4,
                                      label="cache block (paper: 32 at batch 4/8)",
                                      elem_id="batch-cache-block")
            c.axis = gr.Radio([("seconds", "time"), ("passes", "pass")], value="time",
                              label="timeline axis", elem_id="batch-axis")
    with gr.Row():
        c.run = gr.Button("Run batch", variant="primary", elem_id="batch-run")
        c.stop = gr.Button("Stop", variant="stop", elem_id="batch-stop")
    gr.HTML(batch_viz.render_batch_legend_html())
    c.output = gr.HTML(batch_viz.render_batch_html(None, placeholder=EMPTY), elem_id="batch-output")
    c.chart = gr.Plot(batch_viz.make_batch_timeline_figure(None), show_label=False, elem_id="batch-chart")
    c.compare = gr.HTML(batch_viz.render_comparison_html(None), elem_id="batch-compare")
    with gr.Row():
        c.download_html = gr.DownloadButton("Download coloured HTML", interactive=False,
                                            elem_id="batch-download-html", size="sm")
        c.download_json = gr.DownloadButton("Download batch trace (JSON)", interactive=False,
                                            elem_id="batch-download-json", size="sm")
    c.session = session
    c.runner = runner or make_batch_runner(get_lm, pass_slot)
    inputs = [c.prompts, c.tau, c.block, c.max_new, c.cache_block, c.axis, session]
    outputs = [c.output, c.chart, c.compare, c.download_html, c.download_json]
    c.event = c.run.click(c.runner, inputs, outputs, concurrency_id="model", concurrency_limit=concurrency_limit,
                          api_visibility="private", show_progress="hidden", trigger_mode="once")
    c.stop.click(lambda s: s.stop(), [session], None, queue=False, api_visibility="private")
    return c


def make_model_loader(install: Callable[[object], object], guard: Callable | None = None):
    """The paper-checkpoint Load handler: (hub id, token, gr.Progress) -> message HTML. `guard(name, token)`
    -> (name to load or None, refusal message) runs first, on the server, whatever sent the request (the
    app's policy: mars.app.policy). `install(lm)` may raise: a model that cannot run never replaces one that can."""

    def load(hub_id, token=None, progress=gr.Progress()):
        if guard is not None:
            hub_id, refusal = guard(hub_id, token)
            if hub_id is None:
                return f'<div class="mars-banner">{viz.esc(refusal)}</div>'
        lm, message = in_own_thread(load_checkpoint, hub_id, lambda fraction, text: progress(fraction, desc=text))
        if lm is not None:
            try:
                install(lm)
            except Exception as e:  # noqa: BLE001 - the message says it
                message = f"Could not run {lm.name}: {type(e).__name__}: {e}. The current model keeps serving."
        cls = "mars-note" if lm is not None and message.startswith("Loaded") else "mars-banner"
        return f'<div class="{cls}">{viz.esc(message)}</div>'

    return load


def build_model_list(install: Callable[[object], object], guard: Callable | None = None, token=None,
                     allowed: Callable[[str], bool] | None = None) -> SimpleNamespace:
    """The paper's checkpoints as a list with a Load button; call inside the Model tab. Returns the components
    and the load event (chain `.then(...)` on `event` to refresh the app's model panel). `guard`: see
    make_model_loader; `token`: the operator-token component sent with each load; `allowed(hub_id)`: which
    checkpoints the list offers (the server's allow-list).

    elem ids: paper-checkpoint (dropdown), load-paper (button), paper-message (result / progress).
    """
    c = SimpleNamespace()
    gr.Markdown(f"**The paper's own checkpoints** (published by its authors; list from {SOURCE}). Full "
                "fine-tunes of Qwen2.5-Instruct, loaded as plain causal Qwen2; the 0.5B ones run on a CPU Space, "
                "the 7B ones need a large machine. Downloading needs internet access from this server.")
    choices = [(label, value) for label, value in model_choices() if allowed is None or allowed(value)]
    with gr.Row():
        c.dropdown = gr.Dropdown(choices, value=DEFAULT_CHOICE if any(v == DEFAULT_CHOICE for _, v in choices)
                                 else (choices[0][1] if choices else None), label="checkpoint",
                                 elem_id="paper-checkpoint", scale=4)
        c.button = gr.Button("Load checkpoint", elem_id="load-paper", scale=1)
    c.message = gr.HTML(elem_id="paper-message")
    c.loader = make_model_loader(install, guard)
    inputs = [c.dropdown] + ([token] if token is not None else [])
    c.event = c.button.click(c.loader, inputs, [c.message], concurrency_id=SWITCH, concurrency_limit=1,
                             api_visibility="private")
    return c


def paper_links_markdown() -> str:
    """The paper's checkpoints as links to their Hub pages (what a public server offers instead of loading)."""
    rows = [f"- [{c.hub_id}](https://huggingface.co/{c.hub_id}): {c.note}" for c in PAPER_CHECKPOINTS]
    return "**The paper's own checkpoints** (published by its authors):\n" + "\n".join(rows)


def model_tab_help(policy) -> str:
    """What the Model tab says above its controls, by who may switch the model here (policy.switch_mode)."""
    if policy.switch_mode == "open":
        folders = " or a folder of its models folder (MARS_MODELS_DIR)" if policy.models_dir else ""
        hub = "any Hub id" if policy.any_hub_id else "a Hub id from its list (MARS_ALLOWED_MODELS)"
        return (f"Load another checkpoint by {hub}{folders}, e.g. `Xalphinions/MARS-Qwen2.5-0.5B-blk4`. It "
                "replaces the model for **everyone** on this server (it listens on this machine only).")
    source = f"https://huggingface.co/spaces/{policy.space_id}" if policy.space_id else "this app's repository"
    local = (f"To try another model, run the app on your own machine, where the Model tab loads any of the "
             f"checkpoints below:\n\n```\ngit clone {source} mars-playground && cd mars-playground\n"
             "pip install -r requirements.txt\n"
             "MARS_MODEL=Xalphinions/MARS-Qwen2.5-0.5B-blk4 python app.py   # http://127.0.0.1:7860\n```")
    if policy.switch_mode == "token":
        return (f"This server's model is changed by its **operator** only: the Load buttons below need the "
                f"operator's token, checked on the server. {local}")
    return (f"**This server is public** ({policy.why_public}): its operator chose the model above, and no "
            f"visitor can change it for the others. {local}")
