"""The Acceptance tab (issue 43): the lab of mars.evaluation.acceptance_lab in the app, for whoever studies where
and why drafts are accepted. Components and one handler only: the measurement is the lab's, the drawing
mars.app.accept_viz's, and every forward runs on the app's model thread (`pass_slot`), one at a time with the
other visitors' passes. It changes nothing shared: the bare model is the shared model with its gated adapter
closed for the length of one forward on that thread (mars.models.gated.adapter_off).

elem ids: accept-prompts, accept-set, accept-tau, accept-block-size, accept-max-new-tokens, accept-taus,
accept-compare, accept-run, accept-stop, accept-progress, accept-reliability, accept-depth, accept-tpp,
accept-classes, accept-table, accept-download (JSON), accept-download-csv; inside accept-table, once a run has
filled it, each row's button accept-inspect-<kind>-<i> (kind confident_wrong or right_under_tau, i from 0; class
accept-inspect): it opens that row's pass in the Generate tab's inspector (#inspect, mars.app.accept_inspect).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import gradio as gr

from mars.app import accept_viz
from mars.app.viz import plural
from mars.app.accept_inspect import LabCases, case_pass, find_case, keep_cases, render_case_html
from mars.app.errors import failure_error, visitor_error
from mars.app.session import TabSession
from mars.decoding.decoder import DecodeControl, check_int, check_tau
from mars.evaluation.acceptance_lab import MAX_PROMPTS, LabConfig, run_lab
from mars.evaluation.prompt_sets import SETS

UPDATE_EVERY_S = 0.3  # the progress line at most this often
OWN = "your prompts"
INTRO = (f"Up to {MAX_PROMPTS} prompts: the model's greedy answer to each (the last Generate's, or the last "
         "analysis's, is reused), then the "
         "drafts of every mask depth measured **teacher-forced at every position** of those answers, in the training "
         "layout (a few forwards, not one per token). The tokens per pass they predict at each τ stand beside those "
         "measured by decoding the same prompts; **compare** measures the bare model (the adapter off) as well, to "
         "show what training taught.")


def parse_lab_prompts(text, check: Callable[[str], str] | None = None) -> list[str]:
    """One prompt per non-blank line, 1..MAX_PROMPTS of them; ValueError with one message a visitor can act on.
    check: the app's single-prompt check (mars.app.inputs.check_prompt) on every line."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ValueError(f"the prompts must be text, one per line, got {type(text).__name__}")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"no prompts: type one prompt per line (1 to {MAX_PROMPTS}), or pick a built-in set")
    if len(lines) > MAX_PROMPTS:
        raise ValueError(f"{len(lines)} prompts given: the lab takes at most {MAX_PROMPTS}, one per line")
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(check(line) if check else line)
        except ValueError as e:
            raise ValueError(f"line {i}: {e}") from None
    return out


def _answer_within(ids, ended: bool, max_new_tokens: int) -> dict | None:
    """A greedy answer cut to `max_new_tokens` ({"ids", "finished"}), or None where it stopped short of them
    without ending: it says nothing about the tokens after."""
    if not ended and len(ids) < max_new_tokens:
        return None
    return {"ids": list(ids[:max_new_tokens]), "finished": ended and len(ids) <= max_new_tokens}


def reusable_answers(session, max_new_tokens: int, backend: str) -> dict:
    """{prompt: {"ids", "finished"}} from the visitor's last Generate: its AR run, or its verified run (lossless:
    the same greedy text), when finished with the same backend and at least as many new tokens allowed."""
    out = {}
    for run in (getattr(session, "ar", None), getattr(session, "mars", None)):
        if run is None or run.finished is None or run.finish_reason == "cancelled" or not run.prompt:
            continue
        c = run.config
        greedy = c.mode == "ar" or (c.mode == "verified" and c.temperature == 0)
        if not greedy or c.backend != backend:
            continue
        got = _answer_within(run.token_ids, run.finish_reason == "eos", max_new_tokens)
        if got is not None:
            out.setdefault(run.prompt, got)
    return out


def previous_lab_answers(cases: LabCases | None, lm, max_new_tokens: int, backend: str) -> dict:
    """{prompt: {"ids", "finished"}} from the visitor's last analysed lab run: its greedy answers do not depend on
    B, tau or compare, so changing those and analysing again generates nothing again. Only when that run
    measured this very model on this backend, and an answer covers `max_new_tokens` (it ended, or is as long)."""
    if cases is None or cases.model() is not lm or cases.backend != backend:
        return {}
    out = {}
    for a in cases.answers:
        got = _answer_within(a.answer_ids, a.finished, max_new_tokens)
        if got is not None:
            out.setdefault(a.prompt, got)
    return out


# the table's inspect buttons: one listener on the table (its rows are replaced by every run), which sends the
# clicked row's key with the component's click event (gr.EventData: `case`)
INSPECT_JS = ("element.addEventListener('click', (e) => { const b = e.target.closest('button[data-case]'); "
              "if (b) trigger('click', {case: b.dataset.case}); });")
INSPECT_CSS = ("button.accept-inspect { border: 1px solid #0072B2; border-radius: 4px; padding: 0 6px; "
               "color: #0072B2; background: transparent; cursor: pointer; font-size: 0.85em; }")


@dataclass
class AcceptSession(TabSession):
    """One visitor's lab state (a gr.State): the run's control and its download files (TabSession), what opens
    the table's rows in the inspector (`cases`: the LabCases of the run the page shows, None from the moment a new
    run starts until it has analysed; `runs` numbers the runs), and `answered`, the last analysed run's LabCases
    kept for its greedy answers only (a new run reuses them, even after a run stopped before analysing)."""

    cases: LabCases | None = None
    runs: int = 0
    answered: LabCases | None = None

    def close(self) -> None:
        super().close()
        self.cases = self.answered = None

    def write(self, result: dict) -> tuple[str, str]:
        from mars.evaluation.acceptance_lab import to_csv

        folder = self.new_folder("mars-accept-")
        js, cs = folder / "mars-acceptance.json", folder / "mars-acceptance.csv"
        js.write_text(json.dumps(result, indent=1), encoding="utf-8")
        cs.write_text(to_csv(result), encoding="utf-8")
        return str(js), str(cs)


def _progress_text(p) -> str:
    what = {"answers": "greedy answers: pass", "drafts": "teacher-forced forwards", "decoding": "decoding at τ",
            "analysed": "analysed", "done": "done"}[p.stage]
    return f"{p.note}: {what} {p.done} of {p.total}" if p.stage not in ("analysed", "done") else p.note


def _slot_parts(pass_slot) -> tuple:
    """(run, runner_factory) for the lab's forwards: the app's model thread (`pass_slot.run`) and its backend
    (the holder's), or (None, None) where there is no slot (the lab's defaults: here, by the backend's name)."""
    if pass_slot is None:
        return None, None
    return pass_slot.run, getattr(getattr(pass_slot, "holder", None), "backend", None)


def _empty_results() -> tuple:
    """The 4 figures, the table and the 2 downloads of no run: the hints, and the downloads off."""
    off = gr.update(value=None, interactive=False)
    return (accept_viz.make_reliability_figure(None), accept_viz.make_depth_figure(None),
            accept_viz.make_tokens_per_pass_figure(None), accept_viz.make_classes_figure(None),
            accept_viz.render_table_html(None), off, off)


def make_accept_runner(get_lm: Callable[[], object], pass_slot=None):
    """The tab's run handler: a generator of (progress, 4 figures, table, JSON file, CSV file)."""
    from mars.app import inputs
    from mars.app.serving import public_name
    from mars.app.sweep import parse_taus

    def run(prompts_text, tau, block_size, max_new_tokens, taus_text, compare, session: AcceptSession,
            main_session=None):
        lm = get_lm()
        try:
            prompts = parse_lab_prompts(prompts_text, inputs.check_prompt)
            if lm.mask_token_id is None:
                raise ValueError("this model has no mask token: it drafts nothing, so there is no acceptance to study")
            taus = parse_taus(taus_text) if str(taus_text or "").strip() else []
            backend = inputs.app_run_backend(lm)
            cfg = LabConfig(block_size=check_int("block size", block_size, 2, inputs.MAX_BLOCK),
                            max_new_tokens=check_int("max new tokens", max_new_tokens, 1,
                                                            inputs.max_new_tokens_limit()),
                            tau=tau, taus=tuple(t for t in taus if t < 1.0), compare=bool(compare), backend=backend)
            ids = [inputs.encode_checked(lm, p, inputs.make_config("ar", 1.0, 1, cfg.max_new_tokens, top_k=0))
                   for p in prompts]
        except ValueError as e:
            raise visitor_error(e) from None
        session.stop()
        control = session.control = DecodeControl()
        skip = gr.skip()
        d = lm.describe()
        model = {"model": public_name(d["model"]), "adapter": public_name(d["adapter"]), "gated": d["gated"],
                 "trained_block_size": d["trained_block_size"], "backend": backend}
        reuse = {**previous_lab_answers(session.answered, lm, cfg.max_new_tokens, backend),
                 **(reusable_answers(main_session, cfg.max_new_tokens, backend) if main_session is not None else {})}
        run_on, runner_factory = _slot_parts(pass_slot)
        last, result = 0.0, None
        # A new run clears the last one's charts, table and downloads first: stopped before its drafts were
        # measured, the page must not show the previous prompts' results as if they were this run's (a reviewer
        # saw exactly that, inspect buttons and downloads included). Analyse means "these prompts now", as a new
        # run in every other tab; the inspector refuses the old table's keys from here on (`cases` is None).
        session.cases = None
        yield (accept_viz.render_summary_html(None, f"analysing {plural(len(prompts), 'prompt')} (the previous "
                                              "run's results are cleared)"),
               *_empty_results())
        try:
            for p in run_lab(lm, prompts, ids, cfg, run=run_on, control=control, runner_factory=runner_factory,
                             reuse=reuse, describe=model):
                if p.result is not None and p.stage in ("analysed", "decoding", "done"):
                    if p.result is not result:  # this run's analysis, new: its table's rows are the ones to inspect
                        session.runs += 1
                        session.cases = session.answered = keep_cases(session.runs, lm, p.result, p.answers)
                    result = p.result
                    figs = (accept_viz.make_reliability_figure(result), accept_viz.make_depth_figure(result),
                            accept_viz.make_tokens_per_pass_figure(result), accept_viz.make_classes_figure(result))
                    table = accept_viz.render_table_html(result, session.cases.variant, session.cases.run)
                    if p.stage == "done":
                        break
                    yield (accept_viz.render_summary_html(result, _progress_text(p)), *figs, table, skip, skip)
                    continue
                now = time.perf_counter()
                if now - last >= UPDATE_EVERY_S:
                    last = now
                    yield accept_viz.render_summary_html(result, _progress_text(p)), *([skip] * 5), skip, skip
        except GeneratorExit:  # the visitor left: no forward starts for nobody
            control.cancel()
            raise
        except ValueError as e:
            raise visitor_error(e) from None
        except Exception as e:  # the app keeps serving
            raise failure_error(e, "acceptance lab failed", "The acceptance lab failed") from None
        if result is None:
            yield (accept_viz.render_summary_html(None, "stopped before the drafts were measured: no results for "
                                                  "these prompts (the previous run's were cleared when this one "
                                                  "started)"), *_empty_results())
            return
        js, cs = session.write(result)  # stopped while decoding: the drafts are whole, the measured taus partial
        note = "stopped while decoding: the measured τ values are those finished" if control.cancelled else "done"
        yield (accept_viz.render_summary_html(result, note), *figs, table,
               gr.update(value=js, interactive=True), gr.update(value=cs, interactive=True))

    return run


def make_case_inspector(get_lm: Callable[[], object], pass_slot=None):
    """The inspect buttons' handler: (tau, session, the row's key) -> the inspector's HTML of the row's pass,
    decoded once on the model thread (mars.app.accept_inspect); gr.Error with one message for a key that names
    no row of the visitor's current table on the current model. The app shows the HTML in the Generate tab."""
    from mars.app.inputs import TOP_K

    def inspect_case(tau, session: AcceptSession | None, key) -> str:
        lm = get_lm()
        try:
            tau = check_tau(tau)
            cases = session.cases if session is not None else None
            kind, row, answer = find_case(cases, key, lm)
            run_on, runner_factory = _slot_parts(pass_slot)
            rec = case_pass(lm, answer, row["position"], cases.block_size, tau, variant=cases.variant,
                            backend=cases.backend, top_k=TOP_K, run=run_on, runner_factory=runner_factory)
        except ValueError as e:
            raise visitor_error(e) from None
        except Exception as e:  # the app keeps serving
            raise failure_error(e, "lab case inspection failed", "The pass could not be inspected") from None
        return render_case_html(rec, row, kind, answer, lm.tokenizer, cases.block_size)

    return inspect_case


def build_accept_tab(get_lm: Callable[[], object], pass_slot=None, main_session=None,
                     concurrency_limit: int | str | None = "default") -> SimpleNamespace:
    """The Acceptance tab's components and events; call inside `with gr.Tab("Acceptance"):`. `main_session`: the
    app's per-visitor Session state (its last Generate's answers are reused). Returns the components, and
    `inspect_case` (make_case_inspector) for the app to wire to the table's click event."""
    c = SimpleNamespace()
    session = gr.State(AcceptSession(), delete_callback=AcceptSession.close)
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=3):
            c.set = gr.Dropdown([OWN] + list(SETS), value=OWN, label="built-in set (training-side prompts, by kind)",
                                elem_id="accept-set")
            c.prompts = gr.Textbox("\n".join(SETS["facts"][:4]), label=f"Prompts, one per line (1 to {MAX_PROMPTS})",
                                   lines=6, elem_id="accept-prompts")
        with gr.Column(scale=2):
            c.tau = gr.Slider(0.0, 1.0, value=0.9, step=0.01, label="τ (tables and token classes)", elem_id="accept-tau")
            c.block = gr.Slider(2, 16, value=4, step=1, label="block size B", elem_id="accept-block-size")
            c.max_new = gr.Slider(8, 256, value=128, step=8, label="max new tokens", elem_id="accept-max-new-tokens")
            c.taus = gr.Textbox("0.9, 0.7, 0.5", label="τ values decoded to measure tokens/pass (empty: predicted only)",
                                elem_id="accept-taus")
            c.compare = gr.Checkbox(True, label="compare with the bare model (adapter off)", elem_id="accept-compare")
    with gr.Row():
        c.run = gr.Button("Analyse", variant="primary", elem_id="accept-run")
        c.stop = gr.Button("Stop", variant="stop", elem_id="accept-stop")
    c.progress = gr.HTML(elem_id="accept-progress")
    with gr.Row():
        c.depth = gr.Plot(accept_viz.make_depth_figure(None), show_label=False, elem_id="accept-depth")
        c.tpp = gr.Plot(accept_viz.make_tokens_per_pass_figure(None), show_label=False, elem_id="accept-tpp")
    c.reliability = gr.Plot(accept_viz.make_reliability_figure(None), show_label=False, elem_id="accept-reliability")
    c.classes = gr.Plot(accept_viz.make_classes_figure(None), show_label=False, elem_id="accept-classes")
    c.table = gr.HTML(accept_viz.render_table_html(None), elem_id="accept-table", js_on_load=INSPECT_JS,
                      css_template=INSPECT_CSS)
    with gr.Row():
        c.download = gr.DownloadButton("Download the data (JSON)", interactive=False, elem_id="accept-download", size="sm")
        c.download_csv = gr.DownloadButton("Download the data (CSV)", interactive=False, elem_id="accept-download-csv",
                                           size="sm")
    c.session = session
    c.runner = make_accept_runner(get_lm, pass_slot)
    c.inspect_case = make_case_inspector(get_lm, pass_slot)  # wired by the app, whose Generate tab shows it
    inputs = [c.prompts, c.tau, c.block, c.max_new, c.taus, c.compare, session]
    if main_session is not None:
        inputs.append(main_session)
    outputs = [c.progress, c.reliability, c.depth, c.tpp, c.classes, c.table, c.download, c.download_csv]
    c.event = c.run.click(c.runner, inputs, outputs, concurrency_id="model", concurrency_limit=concurrency_limit,
                          api_visibility="private", show_progress="hidden", trigger_mode="once")
    c.stop.click(lambda s: s.stop(), [session], None, queue=False, api_visibility="private")
    c.set.change(lambda name, text: "\n".join(SETS[name]) if name in SETS else text, [c.set, c.prompts], [c.prompts],
                 queue=False, api_visibility="private")
    return c
