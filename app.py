"""MARS Playground: a Gradio Space that makes multi-token generation visible.

Components and event handlers only. The shared model is `mars.app.serving`, a visitor's state
`mars.app.session`, the tau sweep `mars.app.sweep`, input checks `mars.app.inputs`, drawing and text
`mars.app.viz`. `python app.py` serves on GRADIO_SERVER_NAME:GRADIO_SERVER_PORT. Its settings (MARS_MODEL,
MARS_CONCURRENCY, MARS_MAX_NEW_TOKENS, ...) are `mars.settings`, read once at start-up: a bad value stops the
start with one line per bad variable (`python -m mars settings` lists them all). Every limit is checked here,
on the server, whatever a client sends. Who may change the model and what may load (SPACE_ID,
MARS_ADMIN_TOKEN, MARS_ALLOWED_MODELS, MARS_MODELS_DIR, MARS_PUBLIC, MARS_QUEUE_SIZE): `mars.app.policy`,
docs/deploying.md.
"""

# No `from __future__ import annotations` here: Gradio reads api_generate's return annotation at runtime to
# declare the endpoint's two outputs (text, trace), and a postponed string annotation hides them.
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from mars import settings
from mars.app import room_viz, viz
from mars.app.components import ClampedSlider
from mars.app.errors import failure_error, visitor_error
from mars.app.policy import Policy, PolicyError
from mars.app.model_thread import in_own_thread
from mars.app.serving import ModelHolder, load_other, public_name, vet_switch
from mars.app.session import Session, run_stream, trace_json
from mars.app.sweep import parse_taus, sweep
from mars.app.accept_tab import build_accept_tab
from mars.app.tabs import SWITCH, BATCH_CSS, build_batch_tab, build_model_list, model_tab_help, paper_links_markdown
from mars.app.inputs import (
    DEFAULT_MODE_LABEL, MAX_BLOCK, MAX_TREE_NODES_APP, MODE_LABELS, MODE_TAU, TAU_LABELS, app_cut_costs, app_run_backend,
    app_tree_nodes,
    backend_label, chart_every_s, check_mode, check_prompt, encode_checked, fit_to_model, make_config,
    max_new_tokens_limit, mode_block, text_every_s,
)
from mars.decoding.decoder import DEFAULT_BLOCK_SIZE, DecodeControl

ROOT = Path(__file__).resolve().parent
EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text())
LOG = logging.getLogger("mars.app")

CSS = viz.GROUPS_CSS + BATCH_CSS + """
#output .mars-text, #output-ar .mars-text { max-height: 32em; overflow-y: auto; }
#mars-root.mars-present .mars-text { font-size: 26px; line-height: 1.6; }
#mars-root.mars-present .mars-tile b { font-size: 2em; }
#mars-root.mars-present #prompt textarea { font-size: 22px; }
"""  # Gradio scopes custom CSS under .gradio-container .contain: the talk class sits on a column inside it
THEME = gr.themes.Default(primary_hue="blue", font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])

INTRO = """# MARS Playground
**MARS** (Mask AutoRegression) fine-tunes an ordinary causal LM, with no new parameters, to also fill a few
`[MASK]` positions appended to its input. Each forward pass proposes up to **B** tokens; they are accepted
left to right while the model's confidence stays above **τ**. Below, each coloured span is what **one forward
pass** produced. Move τ *while it runs*: the next pass uses it."""

HOW_IT_WORKS = """### Training: one forward pass over [clean | noisy]
Each training sequence appears twice: a **clean** copy and a **noisy** copy whose response tokens are all
`[MASK]`. Both copies use positions 0..L-1; blocks are `t // B`. A clean position sees the clean positions
before it (causal). A noisy position sees strictly earlier **clean blocks** and the noisy positions before it
**inside its own block**. Clean never sees noisy. The loss is the usual cross-entropy on both copies.

### Logit shifting
Logits stay right-shifted as in an AR model: the output at position t predicts token t+1 in both copies.
So the last real token predicts the next token (plain AR), and the mask at offset o inside the window
predicts the token o+2 places after the last real token. No new head is needed.

### Inference window
Prefix = prompt + accepted tokens; append B-1 masks; one forward gives B proposals. Accept the AR token
always, then masks left to right while confidence ≥ τ. τ = 1 is exactly AR decoding. The KV cache keeps the
real tokens; mask entries are dropped after every pass."""

EMPTY_OUTPUT = "Generated text appears here, one coloured span per forward pass."
UNTRAINED = ("No MARS adapter is merged into this model. Unless the checkpoint itself was trained with MARS, "
             "its mask predictions are untrained: expect about 1 token per pass and no speed-up over AR. "
             "The machinery shown here is real; the gains need a trained model.")
LOADING = '<div class="mars-note" data-model="loading">Loading and warming up the model… Generate waits for it.</div>'
VERIFIED_INFO = ("Verified: the model checks last pass's drafts itself, so the text is exactly this model's greedy "
                 "text (the backend the Model panel names: int8 by default on a CPU); struck-through "
                 "text = drafts it rejected. Each pass's drafts come from the mask positions or are copied from "
                 "the prompt and text so far (n-gram lookup), whichever is likelier to be accepted; with the default "
                 "model a tree also takes chains from a table of its own answers to other prompts (the "
                 "datastore); the pass inspector says which. In verified mode τ only chooses which mask drafts "
                 "are sent to be checked (0 = all, the fastest), never what is accepted.")


class MarsApp:
    """The handlers, bound to one shared model holder; `build()` wires them to components (`self.ui`)."""

    def __init__(self, lm_provider=None, policy: Policy | None = None):
        self.holder = ModelHolder(lm_provider, rehearsal=self.rehearse)
        self.policy = policy or Policy.from_env()  # who may switch the model, what may load (mars.app.policy)
        self.demo = None  # the Blocks, once built: its real bind address, once launched, decides `live_policy`
        self.chart_every_s = chart_every_s()  # charts redrawn at most this often while a run streams
        self.text_every_s = text_every_s()  # the text and stats sent at most this often (the first pass at once)
        self.ui = SimpleNamespace()  # the components, by name, once build() has made them

    # ------------------------------------------------------------------------------------------ helpers
    def _lm(self):
        from mars.models.loading import LoadError

        try:
            return self.holder.get()
        except LoadError as e:
            raise visitor_error(f"The model could not be loaded: {e}") from None

    def _charts(self, session: Session) -> dict:
        m = session.mars
        recs = m.steps if m else []
        ar = session.ar.steps if session.ar else None
        return {
            self.ui.chart_tokens: viz.make_tokens_per_pass_figure(m, m.config.block_size if m else None),
            self.ui.chart_conf: viz.make_confidence_figure(recs),
            self.ui.chart_race: viz.make_race_figure(recs, ar),
        }

    def _groups(self, run) -> str:
        """A run's coloured groups; in verified mode with each pass's rejected drafts struck through."""
        texts, rejected = _texts(run)
        return viz.render_groups_html(run.steps, texts, rejected_texts=rejected)

    def _server_line(self) -> str:
        batcher = self.holder.batcher
        return room_viz.render_server_line(batcher.snapshot() if batcher is not None else None)

    def _stats(self, session: Session, state: str, note: str = "") -> str:
        return viz.render_stats_html(viz.live_stats(session.mars, session.ar, state, session.tau, note))

    def _stream_runs(self, session: Session, streams, note, control=None):
        """The one streaming loop. `streams`: per run, (its session slot, "mars" or "ar"; its stream of growing
        records, session.run_stream; its output). Two runs (the race) go side by side, one pass of each in
        turn: the model thread still runs one pass at a time and times each alone, and whatever else the machine
        does meanwhile (Gradio, the page, another visitor) falls on both runs alike. Run one after the other,
        the first took the start of the event on its passes: in the browser race on two cores MARS-then-AR read
        0.88x and AR-then-MARS 1.39x on the same prompts and passes (docs/int8.md).
        The groups of the runs that moved and the stats go out at most every `self.text_every_s` (the event's
        first pass and each run's end at once); charts at most every `self.chart_every_s` while a single run goes,
        never during a race, nor at a run's end: `generate`'s last update draws them once all runs are in. A redraw
        of three figures holds the interpreter for 0.2-0.6 s, and the passes of that moment wait: mid-race, with
        MARS usually done before the first redraw was due, it fell on AR's passes alone (`tools.race
        --chart-every 3.0 inf`, a code prompt, 3 rounds each in turn: 1.68x with redraws every 3 s, 1.37x with
        none; the app's handler without server or page 1.44-1.48x). `control`: the runs'; once it is no
        longer the session's (Clear, or a newer run of this visitor's), the runs are no longer the session's and
        nothing more is written or sent."""
        last_chart = last_text = time.perf_counter()
        live, moved, sent = list(streams), set(), False
        racing = len(streams) > 1
        while live:
            for entry in list(live):
                which, stream, _ = entry
                run = next(stream, None)
                if control is not None and session.control is not control:
                    return
                if run is None:
                    live.remove(entry)
                    continue
                setattr(session, which, run)
                moved.add(which)
                now = time.perf_counter()
                if sent and not run.finished and now - last_text < self.text_every_s:
                    continue  # the next update shows this pass's group too
                sent, last_text = True, now
                upd = {output: self._groups(getattr(session, w)) for w, _, output in streams if w in moved}
                moved.clear()
                upd[self.ui.stats] = self._stats(session, "running", note(session))
                upd[self.ui.server] = self._server_line()
                if not racing and not run.finished and now - last_chart > self.chart_every_s:
                    upd.update(self._charts(session))
                    last_chart = now
                yield upd

    def _write_files(self, session: Session, lm) -> tuple[str, str]:
        old = session.files.get("folder")
        if old:
            shutil.rmtree(old, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(prefix="mars-run-"))
        m, ar = session.mars, session.ar
        html_path, json_path = folder / "mars-generation.html", folder / "mars-trace.json"
        title = f"{viz.mode_name(m.config.mode)} generation ({public_name(lm.name)})"
        texts, rejected = _texts(m)
        html_path.write_text(viz.standalone_html(m.steps, texts, title, m.prompt, viz.summary_line(m, ar), rejected),
                             encoding="utf-8")
        trace = {"model": self._public_model(lm), "mars": trace_json(m), "ar": trace_json(ar) if ar else None}
        json_path.write_text(json.dumps(trace, indent=1), encoding="utf-8")
        session.files = {"folder": str(folder)}
        return str(html_path), str(json_path)

    @staticmethod
    def _public_model(lm) -> dict:
        """The model as visitors see it: names of the model and adapter, no path on this server."""
        d = lm.describe()
        d["model"], d["adapter"] = public_name(d["model"]), public_name(d["adapter"])
        d["warnings"] = [viz.hide_paths(w) for w in d["warnings"]]
        return d

    def rehearse(self, lm):
        """The first visitor's Generate, run once at start-up before the page says ready (ModelHolder.rehearsal):
        the first example at the page's own defaults (mode, tau, B, max new tokens, tree, the AR race), through
        this very handler, so what a first run pays once (a long prompt's pass, the tree's and the race's first
        shapes, the chat template's compilation, the page's HTML and charts, the run files) is paid here. Before
        `build` there are no defaults to rehearse: nothing runs."""
        ui = self.ui
        if not hasattr(ui, "max_new"):
            return
        session = Session()
        try:
            mode = ui.mode.value
            for _ in self.generate(EXAMPLES[0]["prompt"], ui.tau.value, mode_block(_page_mode(mode), lm),
                                   ui.max_new.value, ui.confidence.value, ui.compare.value, mode, session,
                                   ui.tree_nodes.value):
                pass
        finally:
            session.close()  # its run files

    # ----------------------------------------------------------------------------------------- handlers
    def model_info(self, mode=DEFAULT_MODE_LABEL):
        """(one-line banner, full table, block size, keep polling?). While the model loads at start-up the
        banner says so, and the page's timer asks again. The block size is the one the selected mode starts at
        with this model (inputs.mode_block: its trained B, at most 2 for verified mode on a CPU)."""
        from mars.models.loading import LoadError

        if self.holder.state == "loading":
            return LOADING, LOADING, gr.skip(), gr.update(active=True)
        try:
            lm = self.holder.get()
        except LoadError as e:
            error = (f'<div class="mars-banner mars-error">The model could not be loaded: '
                     f"{viz.esc(viz.hide_paths(str(e)))}. The app keeps running: load another model in the "
                     "Model tab.</div>")
            return error, error, gr.skip(), gr.update(active=False)
        d = self._public_model(lm)
        mask = f'{d["mask_token"]} (id {d["mask_token_id"]})' if d["mask_token"] else "none: AR only"
        adapter = d["adapter"] or "none"
        if d["gated"]:
            adapter += " (gated: acts at mask positions only, so tau 1.0 is the bare model)"
        rows = [("model", d["model"]), ("trained block size", d["trained_block_size"] or "unknown"),
                ("mask token", mask), ("adapter", adapter), ("device", d["device"]), ("dtype", d["dtype"]),
                ("backend", backend_label(lm))]
        costs = app_cut_costs(lm)  # measured at warm-up (inputs.app_pass_costs); None under MARS_TREE_CUT=0
        if costs is not None and len(costs.by_width) > 1:
            when = self.holder.costs.when(app_run_backend(lm))  # when, and why if measured again
            rows.append(("tree size", f"{when}: an input more costs +{100 * (costs.by_width[1] - 1):.0f}% "
                         f"of a one-input pass here, mask inputs +{100 * costs.group:.0f}% on top; each tree sends "
                         "only the nodes, and the mask group only while its drafts, that pay for it"))
        notes = d["warnings"] + ([UNTRAINED] if lm.adapter is None else [])  # warnings first: never hidden
        banner, table = viz.render_model_html(rows, notes)
        return banner, table, mode_block(_page_mode(mode), lm), gr.update(active=False)

    def set_tau(self, tau, session: Session):
        """The slider's one handler. tau's whole path, slider to rule:
        slider .change -> here -> Session.set_tau -> DecodeControl.tau (decoding.check_tau, the one check) ->
        decode_steps reads control.tau before every forward pass -> the mode's plan/accept (mars.decoding.modes) ->
        acceptance.accept_lengths. A run starts from its config's tau (DecodeConfig checks it with the same
        check_tau), handed to the control by Session.new_control(cfg.tau) in `generate`."""
        try:
            session.set_tau(tau)
        except ValueError as e:
            raise visitor_error(e) from None

    def stop(self, session: Session):
        session.stop()

    def mode_changed(self, mode):
        """(tau, block size) for the mode switched to. Verified mode is lossless whatever tau and B: it starts at
        its fastest setting on this device, tau 0 (send every draft) and `mode_block`'s B; MARS at tau 0.9 and
        the trained B. While the model is still loading the block slider is left as it is."""
        mode = MODE_LABELS.get(mode, mode)
        return gr.update(value=MODE_TAU[mode], label=TAU_LABELS[mode]), self.mode_block(mode)

    def mode_block(self, mode):
        """The block slider for `mode` (a label or a core name) with the current model (inputs.mode_block); left
        as it is while the model loads."""
        lm = self.holder.loaded
        return gr.update(value=mode_block(_page_mode(mode), lm)) if lm is not None else gr.skip()

    def generate(self, prompt, tau, block_size, max_new_tokens, confidence, compare, mode, session: Session,
                 tree_nodes=0):
        """Stream a MARS (or verified MARS) run pass by pass, then (optionally) the AR baseline on the same prompt."""
        ui = self.ui
        if self.holder.state == "loading":
            yield {ui.stats: self._stats(session, "loading", "waiting for the model to finish loading…")}
        lm = self._lm()
        try:
            mode = check_mode(mode)
            prompt = check_prompt(prompt)
            cfg, notes = fit_to_model(lm, make_config(mode, tau, block_size, max_new_tokens, confidence,
                                                      tree_nodes=tree_nodes))
            ar_cfg = make_config("ar", 1.0, 1, max_new_tokens, confidence, backend=cfg.backend)  # the same model
            ids = encode_checked(lm, prompt, cfg)
        except ValueError as e:
            raise visitor_error(e) from None
        compare = bool(compare) and cfg.mode != "ar"  # a model that can only run AR has nothing to compare
        control = session.new_control(cfg.tau)  # from here on the slider steers this run (set_tau)
        session.mars = session.ar = None
        session.tokenizer = lm.tokenizer
        yield {ui.output: viz.render_groups_html([], placeholder="…"),
               ui.output_ar: viz.render_groups_html([], placeholder="…" if compare else "AR comparison is off.")}

        flags = "; ".join(notes)

        def note(s: Session) -> str:
            ar = ""
            if compare:
                ar = "AR runs beside it, one pass of each in turn"
                ar += f": {viz.plural(s.ar.tokens, 'token')} in {viz.plural(s.ar.passes, 'pass')}" if s.ar else ""
            return "; ".join(filter(None, [flags, ar, room_viz.shared_note(s.mars, s.ar)]))

        streams = [("mars", run_stream(self.holder, lm, prompt, ids, cfg, control), ui.output)]
        if compare:
            streams.append(("ar", run_stream(self.holder, lm, prompt, ids, ar_cfg, control), ui.output_ar))
        try:
            yield from self._stream_runs(session, streams, note, control)
        except ValueError as e:  # e.g. prompt + max new tokens longer than the model's context
            raise visitor_error(e) from None
        except Exception as e:  # the app keeps serving; the log keeps the traceback
            raise failure_error(e, "generation failed") from None
        except GeneratorExit:
            # Gradio closes this generator when the visitor leaves (tab closed, connection lost): closing it
            # closes the decoder's generator too, and the cancel makes sure no pass starts for nobody.
            control.cancel()
            raise
        if session.control is not control:  # cleared, or superseded by a newer run of this visitor's
            # the last update is the page Clear left: Gradio sends an event's last update again when it ends
            yield self._cleared(session) if session.control is None else \
                {ui.stats: self._stats(session, "stopped", "stopped: a newer run of yours took over")}
            return
        stopped = control.cancelled
        m = session.mars
        if m is None or not m.steps:
            yield {ui.stats: self._stats(session, "stopped", "stopped before the first pass")}
            return
        if stopped and session.ar is None and compare:
            yield {ui.output_ar: viz.render_groups_html([], placeholder="stopped: no AR run.")}
        html_path, json_path = self._write_files(session, lm)
        summary = "; ".join(filter(None, [flags, viz.summary_line(m, session.ar), room_viz.shared_note(m, session.ar)]))
        final = {ui.stats: self._stats(session, "stopped" if stopped else "done", summary), ui.server: self._server_line(),
                 ui.inspect_pass: gr.update(maximum=max(1, m.passes - 1), value=0),
                 ui.inspect: self.inspect(0, session),
                 ui.download_html: gr.update(value=html_path, interactive=True),
                 ui.download_json: gr.update(value=json_path, interactive=True)}
        final.update(self._charts(session))
        yield final

    def inspect(self, index, session: Session) -> str:
        m = session.mars
        if m is None or not m.steps:
            return '<div class="mars-note">Generate first, then pick a pass to see its draft positions.</div>'
        i = max(0, min(int(index or 0), m.passes - 1))
        rec = m.steps[i]
        block, mode = m.config.block_size, m.config.mode

        def decode(t):
            return session.tokenizer.decode([t])  # the run's own: the server may have loaded another model since

        timing = f"({rec.seconds * 1000:.0f} ms, {rec.input_len} positions in the forward input)"
        if mode == "verified":
            source = {"mars": " (from the mask positions)", "lookup": " (copied from the text: n-gram lookup)",
                      "store": " (from the datastore of the model's own answers to other prompts)",
                      "mars+lookup": " (from the mask positions and copied from the text)",
                      "mars+store": " (from the mask positions and the datastore of the model's own answers)"}
            header = (f"Pass {i}: {viz.plural(rec.drafts_sent, 'draft')}{source.get(rec.draft_source, '')} checked against "
                      "the model's own choices, "
                      f"{viz.plural(len(rec.token_ids), 'token')} accepted; next drafts sent at tau {rec.tau:.2f} {timing}.")
        else:
            header = (f"Pass {i}: {len(rec.token_ids)} of {viz.plural(block, 'proposal')} accepted at tau {rec.tau:.2f} "
                      f"{timing}.")
        html = viz.render_inspector_html(viz.inspector_rows(rec, decode, mode),
                                         viz.chain_stop_reason(rec, block, mode), header)
        if rec.tree_depths is not None:  # verified with a draft tree: its candidates by depth, the path that won
            own = decode(rec.token_ids[len(rec.tree_path)]) if len(rec.token_ids) > len(rec.tree_path) else None
            html += viz.render_tree_html(viz.tree_rows(rec, decode), own, rec.drafts_sent)
        return html

    def inspect_lab_case(self, tau, accept_session, evt: gr.EventData):
        """An inspect button of the Acceptance table: the row's pass (the tab's `inspect_case`, at the tab's tau)
        shown in this tab's inspector, which opens. The row's key comes with the click (accept_tab.INSPECT_JS)."""
        data = getattr(evt, "_data", None)
        key = data.get("case") if isinstance(data, dict) else None
        html = self.ui.accept.inspect_case(tau, accept_session, key)
        return gr.Tabs(selected="generate"), gr.Accordion(open=True), html

    def run_sweep(self, prompt, taus_text, block_size, max_new_tokens, confidence, session: Session):
        lm = self._lm()
        try:
            prompt = check_prompt(prompt)
            taus = parse_taus(taus_text)
            base = make_config("mars", 1.0, block_size, max_new_tokens, confidence, top_k=0)
            if lm.mask_token_id is None:
                raise ValueError("this model has no mask token: it runs AR only, so there is no tau to sweep")
            ids = encode_checked(lm, prompt, base)
        except ValueError as e:
            raise visitor_error(e) from None
        control = session.new_control()  # each run keeps its own tau: the slider does not steer a sweep
        ar = session.ar
        reuse = ar is not None and ar.finished and ar.finish_reason != "cancelled" and ar.prompt == prompt \
            and ar.config.max_new_tokens == base.max_new_tokens
        yield {self.ui.sweep_table: '<div class="mars-note">running the AR reference, then one run per tau at '
                                     f'B = {base.block_size} (the Generate tab\'s)…</div>'}
        headers = ["tau", "passes", "tokens", "tokens/pass", "seconds", "agreement", "mean NLL"]
        keys = ["tau", "passes", "tokens", "tokens_per_pass", "seconds", "agreement", "nll"]
        for rows in sweep(self.holder, lm, ids, base, taus, control, ar.token_ids if reuse else None):
            table = viz.render_table_html(headers, [[r[k] for k in keys] for r in rows])
            yield {self.ui.chart_sweep: viz.make_sweep_figure(rows, base.block_size), self.ui.sweep_table: table}

    def live_policy(self) -> Policy:
        """The policy for the address the server really listens on (Gradio sets it at launch, whatever
        launched it); before a launch, the environment's (GRADIO_SERVER_NAME, else Gradio's 127.0.0.1)."""
        demo = self.demo
        host = getattr(demo, "server_name", None)
        if host is None:
            return self.policy
        hosts = (host,) + ((demo.node_server_name,) if getattr(demo, "node_server_name", None) else ())
        return self.policy.bound_to(hosts, getattr(demo, "share", False))

    def vet_paper(self, name, token):
        """The paper list's gate: (name to load, "") or (None, why not). Hub ids and the default only."""
        from mars.models.sizing import SizeError

        try:
            request, _ = vet_switch(self.live_policy(), token, name)
        except PolicyError as e:
            return None, str(e)
        except SizeError as e:
            return None, f"Cannot load: {e}. The current model keeps serving."
        if request.kind == "folder":
            return None, self.live_policy().not_offered(request.shown)
        return request.name, ""

    def model_tab_view(self):
        """The Model tab for the live policy: its help text, the switch controls (hidden where nobody may
        switch), the token box (where a token is set), the paper's links (where the controls are hidden)."""
        policy = self.live_policy()
        mode = policy.switch_mode
        return (model_tab_help(policy), gr.update(visible=mode != "closed"), gr.update(visible=mode == "token"),
                gr.update(visible=mode == "closed"))

    def load_model(self, model, adapter, token=None):
        lm, message = in_own_thread(load_other, model, adapter, self.live_policy(), token)  # see model_thread
        if lm is not None:
            try:
                self.holder.replace(lm)  # one short pass first: a model that cannot run never replaces one that can
            except Exception as e:  # noqa: BLE001 - the message says it; the current model keeps serving
                LOG.exception("the loaded model failed its first pass")
                message = (f"Could not run {public_name(lm.name)}: {type(e).__name__}: {e}. "
                           "The current model keeps serving.")
        cls = "mars-note" if lm is not None and message.startswith("Loaded") else "mars-banner"
        return (f'<div class="{cls}">{viz.esc(viz.hide_paths(message))}</div>', *self.model_info()[:3])

    def clear(self, session: Session):
        """Outputs, charts, downloads and the session's traces; the prompt stays, ready to run again."""
        session.clear()  # a run still going ends, its last update the same cleared page (`generate`)
        return self._cleared(session)

    def _cleared(self, session: Session) -> dict:
        return {self.ui.output: viz.render_groups_html([], placeholder=EMPTY_OUTPUT),
                self.ui.output_ar: viz.render_groups_html([]),
                self.ui.stats: self._stats(session, "idle"), self.ui.inspect: self.inspect(0, session),
                self.ui.download_html: gr.update(value=None, interactive=False),
                self.ui.download_json: gr.update(value=None, interactive=False),
                **self._charts(session)}

    # Gradio reads the return annotation to declare the endpoint's two outputs; the function is a generator
    # (one yield per pass) so that Gradio closes it, and the run stops within a pass, when the caller leaves:
    # a plain function would run on to max_new_tokens for nobody. Clients get the last yield.
    def api_generate(
        self, prompt: str, tau: float = 0.9, block_size: int = DEFAULT_BLOCK_SIZE, max_new_tokens: int = 128
    ) -> tuple[str, dict]:
        """Generate an answer with MARS and return it with its per-pass trace.

        Parameters:
            prompt: the user message (it goes through the model's chat template)
            tau: confidence threshold in [0, 1]; 1.0 is plain AR decoding, lower accepts more tokens per pass
            block_size: proposals per forward pass (B), 1 to 16
            max_new_tokens: how many tokens to generate at most
        Returns:
            the generated text, and the trace: one record per forward pass (accepted token ids and texts,
            their confidences, the rejected proposals, tau, seconds) plus totals, and `warnings`
        """
        yield from self._api_run("mars", prompt, tau, block_size, max_new_tokens)

    def api_generate_verified(
        self, prompt: str, block_size: int | None = None, max_new_tokens: int = 128, tau: float = 0.0,
        tree_nodes: int | None = None,
    ) -> tuple[str, dict]:
        """Generate an answer with verified (lossless) MARS: exactly this model's greedy text (the server's
        backend's model: int8 matrices by default on a CPU, see the trace's settings.backend), in fewer passes.
        By default it drafts as the page does (its block size and tree, with the datastore and this machine's pass
        costs where the page has them; the trace's settings say what ran).

        Parameters:
            prompt: the user message (it goes through the model's chat template)
            block_size: drafts proposed per forward pass (B), 1 to 16; empty: the page's (2 on a CPU)
            max_new_tokens: how many tokens to generate at most
            tau: which drafts are sent to be checked (confidence >= tau); 0.0 sends all, the fastest. It never
                changes the text, which is always this model's greedy text
            tree_nodes: draft tokens checked per pass as a tree, 0 = one chain; empty: the page's (4 on a CPU)
        Returns:
            the generated text and its per-pass trace, as /generate
        """
        yield from self._api_run("verified", prompt, tau, block_size, max_new_tokens, tree_nodes, page_default=True)

    def _api_run(self, mode, prompt, tau, block_size, max_new_tokens, tree_nodes=0, page_default=False):
        lm = self._lm()
        control = DecodeControl()
        try:
            prompt = check_prompt(prompt)
            if page_default:  # an empty block size or tree: the page's own setting for this mode on this device
                block_size = mode_block(mode, lm) if block_size is None else block_size
                tree_nodes = app_tree_nodes() if tree_nodes is None else tree_nodes
            cfg, notes = fit_to_model(lm, make_config(mode, tau, block_size, max_new_tokens, "prob", top_k=0,
                                                      tree_nodes=tree_nodes))
            ids = encode_checked(lm, prompt, cfg)
            run, sent = None, 0.0
            for run in run_stream(self.holder, lm, prompt, ids, cfg, control):
                # the first group at once, then at most every text_every_s: in a room each update is the server's
                # work (and its client's) on the same cores as the passes
                now = time.perf_counter()
                if not run.finished and (not sent or now - sent >= self.text_every_s):
                    sent = now
                    yield run.text, {"partial": True, "passes": run.passes}
        except ValueError as e:
            raise visitor_error(e) from None
        except GeneratorExit:  # the caller went away: no further pass starts
            control.cancel()
            raise
        except Exception as e:  # the app keeps serving; the log keeps the traceback
            raise failure_error(e, "API generation failed") from None
        yield run.text, trace_json(run) | {"model": public_name(lm.name), "warnings": notes}

    def mask(self, length, block_size):
        return viz.make_mask_heatmap(int(length), int(block_size))

    # -------------------------------------------------------------------------------------- components
    def build(self) -> gr.Blocks:
        # generations at once: with continuous batching the pass's row cap (each event brings one or two rows;
        # rows past the cap wait at the batcher, in order), else MARS_CONCURRENCY runs taking turns pass by pass
        limit = settings.get().batch_rows if settings.get().batching else settings.get().concurrency
        # delete_cache: Gradio's copies of the download files older than a day go, checked every hour
        with gr.Blocks(title="MARS Playground", analytics_enabled=False, delete_cache=(3600, 86400)) as demo:
            # Gradio deep-copies the value: one fresh Session per visitor; an hour after the visitor has gone,
            # Session.close deletes its run files
            session = gr.State(Session(), delete_callback=Session.close)
            with gr.Column(elem_id="mars-root"):  # the large-font switch toggles a class here
                gr.Markdown(INTRO)
                self.ui.model_banner = gr.HTML(LOADING, elem_id="model-banner")
                # asks again every second while the model loads at start-up; model_info stops it once ready
                self.ui.model_timer = gr.Timer(1.0, active=False)
                with gr.Tabs() as self.ui.tabs:
                    with gr.Tab("Generate", id="generate"):  # the id: the Acceptance table's rows open here
                        self._generate_tab()
                    with gr.Tab("Sweep τ"):
                        self._sweep_tab()
                    with gr.Tab("Batch"):  # the paper's Figure 4, live (mars.app.tabs)
                        self.ui.batch = build_batch_tab(self._lm, self.holder.pass_slot, concurrency_limit=limit)
                    with gr.Tab("Acceptance"):  # issue 43: where and why drafts are accepted (mars.app.accept_tab)
                        self.ui.accept = build_accept_tab(self._lm, self.holder.pass_slot, session, limit)
                    with gr.Tab("How it works"):
                        self._how_tab()
                    with gr.Tab("Model"):
                        self._model_tab()
            self._wire(demo, session, limit)
        # beyond max_size waiting events, a visitor is told "busy, try again" (Gradio: HTTP 503, queue_full)
        demo.queue(default_concurrency_limit=limit, max_size=self.policy.queue_size)
        demo.mars_app = self  # tests reach the handlers and components through it
        self.demo = demo
        return demo

    def _generate_tab(self):
        ui = self.ui
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                ui.prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt",
                                      placeholder="Ask something, or pick an example below")
                gr.Examples([[e["prompt"]] for e in EXAMPLES], inputs=[ui.prompt], label="Examples",
                            example_labels=[e["label"] for e in EXAMPLES], examples_per_page=12)
                with gr.Row():
                    ui.generate = gr.Button("Generate", variant="primary", elem_id="generate")
                    ui.stop = gr.Button("Stop", variant="stop", elem_id="stop")
                    ui.clear = gr.Button("Clear", elem_id="clear")
                with gr.Row():
                    first = MODE_LABELS[DEFAULT_MODE_LABEL]
                    ui.tau = gr.Slider(0.0, 1.0, value=MODE_TAU[first], step=0.01, elem_id="tau",
                                      label=TAU_LABELS[first])
                    ui.block = gr.Slider(1, MAX_BLOCK, value=mode_block(first), step=1, label="block size B",
                                         elem_id="block-size")
                    ui.max_new = gr.Slider(8, max_new_tokens_limit(), value=128, step=8, label="max new tokens",
                                          elem_id="max-new-tokens")
                ui.mode = gr.Radio(list(MODE_LABELS), value=DEFAULT_MODE_LABEL, label="decoding",
                                  elem_id="mode",
                                  info=VERIFIED_INFO)
                ui.tree_nodes = gr.Slider(0, MAX_TREE_NODES_APP, value=app_tree_nodes(), step=1,
                                          elem_id="tree-nodes",
                                          label="tree nodes (verified: candidates checked per pass; 0 = one chain)")
                with gr.Row():
                    ui.confidence = gr.Dropdown(["prob", "entropy", "margin"], value="prob",
                                               label="confidence measure", elem_id="confidence")
                    ui.compare = gr.Checkbox(True, label="race AR beside it on the same prompt (measured speed-up)",
                                            elem_id="compare-ar")
                    ui.present = gr.Checkbox(False, label="large font (talks)", elem_id="present")
                gr.HTML(viz.render_legend_html())
                with gr.Row(equal_height=False):
                    with gr.Column():
                        gr.Markdown("**MARS** (τ rule, B proposals per pass)")
                        ui.output = gr.HTML(viz.render_groups_html([], placeholder=EMPTY_OUTPUT), elem_id="output")
                    with gr.Column():
                        gr.Markdown("**AR baseline** (same model, one token per pass)")
                        ui.output_ar = gr.HTML(viz.render_groups_html([]), elem_id="output-ar")
                ui.stats = gr.HTML(viz.render_stats_html({}), elem_id="stats")
                ui.server = gr.HTML(self._server_line(), elem_id="server-line")  # the room's shared passes, live
                with gr.Row():
                    ui.download_html = gr.DownloadButton("Download coloured HTML", interactive=False,
                                                        elem_id="download-html", size="sm")
                    ui.download_json = gr.DownloadButton("Download trace (JSON)", interactive=False,
                                                        elem_id="download-json", size="sm")
                with gr.Accordion("Inspect a pass", open=True) as ui.inspect_box:
                    ui.inspect_pass = ClampedSlider(0, 1, value=0, step=1, label="pass", elem_id="inspect-pass")
                    ui.inspect = gr.HTML(self.inspect(0, Session()), elem_id="inspect")
            with gr.Column(scale=2):
                ui.chart_tokens = gr.Plot(viz.make_tokens_per_pass_figure(None), show_label=False,
                                         elem_id="chart-tokens")
                ui.chart_conf = gr.Plot(viz.make_confidence_figure([]), show_label=False, elem_id="chart-conf")
                ui.chart_race = gr.Plot(viz.make_race_figure([]), show_label=False, elem_id="chart-race")

    def _sweep_tab(self):
        ui = self.ui
        gr.Markdown("Runs the current prompt (Generate tab settings) once per τ and compares each run with the "
                    "AR output: **agreement** = exact common prefix / longer length; **mean NLL** = the AR "
                    "model's negative log-likelihood of the text (nats/token).")
        with gr.Row():
            ui.sweep_taus = gr.Textbox("1.0, 0.9, 0.8, 0.7, 0.5", label="τ values", elem_id="sweep-taus")
            ui.sweep_btn = gr.Button("Sweep τ", variant="primary", elem_id="sweep")
            ui.sweep_stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
        ui.chart_sweep = gr.Plot(viz.make_sweep_figure([]), show_label=False, elem_id="chart-sweep")
        ui.sweep_table = gr.HTML(elem_id="sweep-table")

    def _how_tab(self):
        ui = self.ui
        with gr.Row():
            ui.mask_len = gr.Slider(2, 24, value=8, step=1, label="sequence length L", elem_id="mask-length")
            ui.mask_block = gr.Slider(1, 8, value=4, step=1, label="block size B", elem_id="mask-block")
        ui.chart_mask = gr.Plot(viz.make_mask_heatmap(8, 4), show_label=False, elem_id="chart-mask")
        gr.Markdown(HOW_IT_WORKS)

    def _model_tab(self):
        ui = self.ui
        ui.model_info = gr.HTML('<div class="mars-note">loading…</div>', elem_id="model-info")
        mode = self.policy.switch_mode  # the page load re-reads it for the address actually bound
        ui.model_help = gr.Markdown(model_tab_help(self.policy), elem_id="model-help")
        # hidden where nobody may switch; the handlers refuse on the server either way (live_policy)
        with gr.Column(visible=mode != "closed", elem_id="model-switch") as ui.switch_box:
            ui.admin_token = gr.Textbox(label="operator token (MARS_ADMIN_TOKEN)", type="password",
                                        elem_id="admin-token", visible=mode == "token")
            with gr.Row():
                ui.model_id = gr.Textbox(label="Hub id or folder", elem_id="model-id")
                ui.model_adapter = gr.Textbox(label="adapter folder (optional)", elem_id="model-adapter")
            ui.load_btn = gr.Button("Load", elem_id="load-model")
            ui.model_message = gr.HTML(elem_id="model-message")
            ui.paper = build_model_list(self.holder.replace, self.vet_paper, ui.admin_token,
                                        self.policy.allows_hub_id)
        ui.paper_links = gr.Markdown(paper_links_markdown(), visible=mode == "closed", elem_id="paper-links")

    def _wire(self, demo: gr.Blocks, session: gr.State, limit: int):
        ui = self.ui
        # the public API first, so that it owns the name "generate"; UI events are private
        gr.api(self.api_generate, api_name="generate", concurrency_id="model", concurrency_limit=limit)
        gr.api(self.api_generate_verified, api_name="generate_verified", concurrency_id="model",
               concurrency_limit=limit)
        # streaming events show Gradio's progress on the stats tiles only ("minimal": no animation competing
        # with the stream for the browser's main thread): a visitor beyond the running slots reads their
        # place in the queue there
        model_events = dict(concurrency_id="model", concurrency_limit=limit, api_visibility="private",
                            show_progress="minimal", show_progress_on=[ui.stats], trigger_mode="once")
        quick = dict(queue=False, api_visibility="private")  # tau, stop: must act while a run holds the queue
        info_outputs = [ui.model_banner, ui.model_info, ui.block, ui.model_timer]
        demo.load(self.model_info, [ui.mode], info_outputs, api_visibility="private")  # may load: queued
        # while the start-up load runs, the answer is immediate: no queue, so a busy queue cannot delay it
        ui.model_timer.tick(self.model_info, [ui.mode], info_outputs, api_visibility="private", queue=False)
        ui.mode.change(self.mode_changed, [ui.mode], [ui.tau, ui.block], **quick)
        gen_outputs = [ui.output, ui.output_ar, ui.stats, ui.chart_tokens, ui.chart_conf, ui.chart_race,
                       ui.inspect_pass, ui.inspect, ui.download_html, ui.download_json, ui.server]
        gen_inputs = [ui.prompt, ui.tau, ui.block, ui.max_new, ui.confidence, ui.compare, ui.mode, session,
                      ui.tree_nodes]
        ui.generate.click(self.generate, gen_inputs, gen_outputs, api_name="ui_generate", **model_events)
        ui.prompt.submit(self.generate, gen_inputs, gen_outputs, api_name="ui_generate_submit", **model_events)
        ui.tau.change(self.set_tau, [ui.tau, session], None, **quick)
        ui.stop.click(self.stop, [session], None, **quick)
        ui.sweep_stop.click(self.stop, [session], None, **quick)
        ui.clear.click(self.clear, [session], [ui.output, ui.output_ar, ui.stats, ui.inspect, ui.download_html,
                                               ui.download_json, ui.chart_tokens, ui.chart_conf, ui.chart_race],
                       **quick)
        ui.inspect_pass.change(self.inspect, [ui.inspect_pass, session], [ui.inspect], **quick)
        toggle = "(on) => { document.getElementById('mars-root').classList.toggle('mars-present', on); return []; }"
        ui.present.change(None, [ui.present], None, js=toggle)
        ui.sweep_btn.click(self.run_sweep, [ui.prompt, ui.sweep_taus, ui.block, ui.max_new, ui.confidence, session],
                          [ui.chart_sweep, ui.sweep_table], **model_events)
        acc = ui.accept  # its table's inspect buttons open a row's pass in this tab's inspector
        acc.table.click(self.inspect_lab_case, [acc.tau, acc.session], [ui.tabs, ui.inspect_box, ui.inspect],
                        concurrency_id="model", concurrency_limit=limit, api_visibility="private",
                        show_progress="minimal", show_progress_on=[ui.inspect]
                        ).success(None, None, None, js="() => document.getElementById('inspect')?.scrollIntoView()")
        for slider in (ui.mask_len, ui.mask_block):
            slider.change(self.mask, [ui.mask_len, ui.mask_block], [ui.chart_mask], **quick)
        ui.paper.event.then(self.model_info, [ui.mode], info_outputs, api_visibility="private")
        demo.load(self.model_tab_view, None, [ui.model_help, ui.switch_box, ui.admin_token, ui.paper_links],
                  queue=False, api_visibility="private")
        # one load at a time, whichever button: each is sized against what is free while no other loads
        ui.load_btn.click(self.load_model, [ui.model_id, ui.model_adapter, ui.admin_token],
                         [ui.model_message, ui.model_banner, ui.model_info, ui.block],
                         concurrency_id=SWITCH, concurrency_limit=1, api_visibility="private"
                         ).then(self.mode_block, [ui.mode], [ui.block], **quick)  # the new model's B for this mode


def _page_mode(mode) -> str:
    """The core name of the mode radio's value (a label, or a core name); the page's default for anything else."""
    try:
        return check_mode(mode)
    except ValueError:
        return MODE_LABELS[DEFAULT_MODE_LABEL]


def _texts(run) -> tuple[list, list | None]:
    """(each pass's token texts, each pass's struck-through drafts in verified mode, else None) of a run."""
    texts = [r.token_texts for r in run.steps]
    return texts, [r.rejected_texts for r in run.steps] if run.config.mode == "verified" else None


def create_demo(lm_provider=None, policy: Policy | None = None) -> gr.Blocks:
    """The app. lm_provider: a zero-argument callable returning a LoadedModel (default: env MARS_MODEL /
    MARS_ADAPTER through mars.models.loading.load), called once and shared by every visitor: on first use, or at
    start-up with `demo.mars_app.holder.start()` (what `launch` does). policy: who may switch the model and what
    may load (default: read from the environment, mars.app.policy)."""
    return MarsApp(lm_provider, policy).build()


def launch(demo: gr.Blocks | None = None, **kwargs):
    """Start loading and warming up the model in the background, then serve with the app's theme and CSS
    (Gradio 6 takes them at launch). The page says the model is loading; Generate waits for it."""
    demo = demo or create_demo()
    demo.mars_app.holder.start()
    return demo.launch(theme=THEME, css=CSS, **kwargs)


if __name__ == "__main__":
    try:
        settings.get()  # a bad variable stops the start here, with its message and no traceback
    except settings.SettingsError as e:
        raise SystemExit(f"MARS Playground cannot start:\n{e}") from None
    launch()
