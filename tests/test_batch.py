"""The Batch tab's logic and drawing: one batch on the block-level KV cache, its idle rows, the measured
comparison, and the rows' HTML and timeline (tiny model, no browser)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from mars.app import batch_viz
from mars.app.batch import (
    MAX_BATCH, BatchRow, BatchState, measure_comparison, parse_batch_prompts, run_batch,
)
from mars.decoding.decoder import DecodeConfig, DecodeControl, encode_prompt, generate_ids
from mars.decoding.records import PassRecord, RunRecord

PROMPTS = [
    "what is the capital of france ?",
    "tell me a word",
    "add 2 + 3 = ?",
    "write a long sentence about the water and the earth and the air and the people who live here",
]
# on the tiny model these settings make rows accept different counts per pass, so some wait at block ends
IDLE_CFG = DecodeConfig(tau=0.1, block_size=4, max_new_tokens=30, cache_block=4)
XSS = ["<script>alert(1)</script>", '<img src=x onerror="alert(1)">']


class Tags(HTMLParser):
    """(tag, attrs) in document order, and each `.mars-row`'s text as a browser would read it."""

    def __init__(self, html):
        super().__init__()
        self.tags, self.row_text, self._depth = [], [], None
        self._stack = 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "div":
            self._stack += 1
        if "mars-row" in attrs.get("class", "").split():
            self.row_text.append("")
        if "mars-text" in attrs.get("class", "").split():
            self._depth = self._stack

    def handle_endtag(self, tag):
        if tag == "div":
            if self._depth == self._stack:
                self._depth = None
            self._stack -= 1

    def handle_data(self, data):
        if self._depth is not None:
            self.row_text[-1] += data

    def having(self, cls):
        return [a for _, a in self.tags if cls in a.get("class", "").split()]


def final(it):
    state = None
    for state in it:
        pass
    return state


@pytest.fixture(scope="module")
def batch(tiny_lm):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]
    states = []
    for s in run_batch(tiny_lm, PROMPTS, ids, IDLE_CFG):
        states.append((s.batch_passes, [r.run.passes for r in s.rows], s.done))
    return s, ids, states


# ---- input


def test_prompts_one_per_line_blank_lines_skipped():
    assert parse_batch_prompts("a\n\n  \nb  \n") == ["a", "b"]
    assert parse_batch_prompts("x\n" * MAX_BATCH) == ["x"] * MAX_BATCH
    for bad, msg in (("", "no prompts"), ("\n \n", "no prompts"), (None, "no prompts"),
                     ("x\n" * (MAX_BATCH + 1), "at most 8"), (3, "must be text")):
        with pytest.raises(ValueError, match=msg):
            parse_batch_prompts(bad)


def test_each_line_gets_the_single_prompt_check_with_its_line_number():
    def check(p):
        if "bad" in p:
            raise ValueError("the prompt is too long")
        return p.upper()

    assert parse_batch_prompts("a\nb", check) == ["A", "B"]
    with pytest.raises(ValueError, match="line 2: the prompt is too long"):
        parse_batch_prompts("ok\n\nbad", check)


# ---- the run


def test_one_row_per_prompt_streamed_pass_by_pass(batch):
    state, _, states = batch
    assert len(state.rows) == len(PROMPTS) and [r.prompt for r in state.rows] == PROMPTS
    assert [p for p, _, _ in states[:-1]] == list(range(1, state.batch_passes + 1))  # one state per pass
    assert states[-1][2] and not any(d for _, _, d in states[:-1])  # the last one says the run is done
    assert len(state.pass_seconds) == state.batch_passes and all(s > 0 for s in state.pass_seconds)
    assert all(r.finished for r in state.rows)


def test_rows_idle_at_cache_block_ends_and_each_pass_is_accounted_for(batch):
    state, _, _ = batch
    assert state.idle_row_passes > 0 and sum(1 for r in state.rows if r.idle_passes) >= 2
    for r in state.rows:
        proposed = [rec.pass_index for rec in r.run.steps]
        assert not set(proposed) & set(r.idle_passes)
        # a row is busy or idle in every pass until it finishes, and absent after
        assert sorted(proposed + r.idle_passes) == list(range(proposed[-1] + 1))


def test_no_idling_with_a_cache_block_longer_than_the_answers(tiny_lm, batch):
    _, ids, _ = batch
    from dataclasses import replace

    state = final(run_batch(tiny_lm, PROMPTS, ids, replace(IDLE_CFG, cache_block=256)))
    assert state.idle_row_passes == 0


def test_batch_rows_equal_each_prompt_alone(tiny_lm, batch):
    state, ids, _ = batch
    for row, p in zip(state.rows, ids):
        alone = generate_ids(tiny_lm, [p], IDLE_CFG)[0]
        assert row.run.token_ids == alone.token_ids and row.run.config is IDLE_CFG
        assert [len(r.token_ids) for r in row.run.steps] == [len(s.token_ids) for s in alone.steps]
        assert row.token_texts[0] == [tiny_lm.tokenizer.decode([t]) for t in row.run.steps[0].token_ids]


def test_comparison_is_measured_against_alone_and_ar_at_the_same_batch_size(tiny_lm, batch):
    state, ids, _ = batch
    steps = list(measure_comparison(tiny_lm, state, IDLE_CFG))
    assert len(steps) == 2 and steps[0].ar_batch is None  # alone first, then AR
    comp = steps[-1]
    assert comp.same_as_alone is True
    assert [r.batch_size for r in comp.runs] == [4, 1, 4]
    b, alone, ar = comp.batch.totals, comp.one_at_a_time.totals, comp.ar_batch.totals
    assert (b.batch_passes, b.tokens) == (state.batch_passes, sum(r.run.tokens for r in state.rows))
    assert b.batch_seconds == pytest.approx(sum(state.pass_seconds))
    singles = [generate_ids(tiny_lm, [p], IDLE_CFG)[0] for p in ids]
    assert alone.batch_passes == alone.passes == sum(s.passes for s in singles) and alone.tokens == b.tokens
    assert alone.tokens_per_pass == pytest.approx(b.tokens_per_pass)
    ar_runs = generate_ids(tiny_lm, ids, DecodeConfig(mode="ar", max_new_tokens=30))
    assert ar.tokens == sum(len(r.token_ids) for r in ar_runs) and ar.tokens_per_pass == 1.0
    assert ar.batch_passes == max(len(r.token_ids) for r in ar_runs)
    assert b.batch_passes < alone.batch_passes  # a batch pass serves several rows
    for measure, other in ((comp.one_at_a_time, alone), (comp.ar_batch, ar)):
        s = comp.speedup(measure)
        assert s == pytest.approx((other.batch_seconds / other.tokens) / (b.batch_seconds / b.tokens)) and s > 0
    d = comp.to_dict()
    assert [r["label"] for r in d["runs"]] == ["MARS batch of 4", "MARS one at a time", "AR batch of 4"]
    assert d["runs"][2]["tokens_per_pass"] == 1.0 and d["runs"][0]["batch_passes"] == state.batch_passes


def test_cancel_ends_the_batch_and_the_comparison(tiny_lm, batch):
    _, ids, _ = batch
    control = DecodeControl()
    seen = 0
    for state in run_batch(tiny_lm, PROMPTS, ids, IDLE_CFG, control):
        seen += 1
        if seen == 2:
            control.cancel()
    assert state.done and state.batch_passes == 2
    assert {r.run.finish_reason for r in state.rows} <= {"cancelled", "eos", "length"}
    assert any(r.run.finish_reason == "cancelled" for r in state.rows)
    assert list(measure_comparison(tiny_lm, state, IDLE_CFG, control)) == []


def test_a_lock_is_held_around_every_pass(tiny_lm, batch):
    _, ids, _ = batch

    class Counting:
        n = 0

        def __enter__(self):
            Counting.n += 1

        def __exit__(self, *exc):
            return False

    state = final(run_batch(tiny_lm, PROMPTS[:2], ids[:2], IDLE_CFG, lock=Counting()))
    assert Counting.n == state.batch_passes + 1  # every pass, and the call that finds the run over


def test_batch_size_limits(tiny_lm):
    with pytest.raises(ValueError, match="1 to 8"):
        list(run_batch(tiny_lm, [], [], IDLE_CFG))
    with pytest.raises(ValueError, match="1 to 8"):
        list(run_batch(tiny_lm, ["a"] * 9, [[5]] * 9, IDLE_CFG))


# ---- drawing


def test_rows_hold_groups_with_the_main_outputs_attributes_and_idle_markers(batch):
    state, _, _ = batch
    html = batch_viz.render_batch_html(state)
    parsed = Tags(html)
    container = parsed.tags[0][1]
    assert container["class"] == "mars-batch" and container["data-rows"] == "4"
    assert container["data-state"] == "done" and container["data-idle"] == str(state.idle_row_passes)
    rows = parsed.having("mars-row")
    assert [r["data-row"] for r in rows] == ["0", "1", "2", "3"]
    assert [r["data-state"] for r in rows] == ["finished"] * 4
    chunks = html.split('<div class="mars-row" ')[1:]
    for row, chunk, text in zip(state.rows, chunks, parsed.row_text):
        p = Tags('<div class="mars-row" ' + chunk)
        groups = p.having("mars-group")
        steps = row.run.steps
        assert [g["data-pass"] for g in groups] == [str(r.pass_index) for r in steps]
        assert [g["data-size"] for g in groups] == [str(len(r.token_ids)) for r in steps]
        assert [g["data-tau"] for g in groups] == ["0.100"] * len(steps)
        assert groups[0]["data-conf"] == " ".join(f"{c:.3f}" for c in steps[0].confidences)
        idle = p.having("mars-idle")
        assert [int(x) for m in idle for x in m["data-passes"].split()] == row.idle_passes
        end = "∎" * sum(1 for r in steps if not r.text)  # an empty group (EOS) shows the end mark
        assert text == row.run.text + end  # idle markers are drawn by CSS: the row's text is the answer alone
        # groups and idle stretches appear in pass order
        order = [int(a.get("data-pass") or a["data-passes"].split()[0]) for _, a in p.tags
                 if {"mars-group", "mars-idle"} & set(a.get("class", "").split())]
        assert order == sorted(order)


def test_a_row_waiting_now_is_marked_idle(batch):
    rec = PassRecord(row=0, pass_index=0, token_ids=[1], text="a", confidences=[0.5], rejected_token_ids=[],
                     rejected_confidences=[], tau=0.9, seconds=0.01, cache_len=0, input_len=4)
    waiting = BatchRow(0, "p", RunRecord(IDLE_CFG, [1]).add(rec), [["a"]], idle_passes=[1, 2])
    state = BatchState([waiting], {}, pass_seconds=[0.01, 0.01, 0.01])
    row = Tags(batch_viz.render_batch_html(state)).having("mars-row")[0]
    assert row["data-state"] == "idle" and row["data-idle"] == "2"
    marker = Tags(batch_viz.render_batch_html(state)).having("mars-idle")[0]
    assert marker["data-count"] == "2" and marker["data-label"] == "‖2"
    assert ".mars-idle::before { content: attr(data-label); }" in batch_viz.BATCH_CSS


@pytest.mark.parametrize("payload", XSS)
def test_prompts_and_outputs_are_escaped(payload):
    rec = PassRecord(row=0, pass_index=0, token_ids=[1, 2], text=payload, confidences=[0.5, 0.4],
                     rejected_token_ids=[], rejected_confidences=[], tau=0.9, seconds=0.01, cache_len=0,
                     input_len=4, finish_reason="eos")
    state = BatchState([BatchRow(0, payload, RunRecord(IDLE_CFG, [1]).add(rec), [[payload, ""]])], {},
                       pass_seconds=[0.01], done=True)
    for html in (batch_viz.render_batch_html(state), batch_viz.standalone_batch_html(state, None, payload, payload)):
        parsed = Tags(html)
        assert not {t for t, _ in parsed.tags} & {"script", "img"}
        assert parsed.row_text == [payload]
    assert parsed.having("mars-row-prompt")  # the prompt is shown (escaped) in the row's header


def test_empty_batch_placeholder():
    html = batch_viz.render_batch_html(None, placeholder="<b>type prompts</b>")
    assert 'data-rows="0"' in html and "&lt;b&gt;type prompts" in html


def test_timeline_puts_every_pass_on_the_shared_axis(batch):
    state, _, _ = batch
    fig = batch_viz.make_batch_timeline_figure(state)
    acc, idle = fig.data
    assert len(acc.y) == sum(r.run.passes for r in state.rows)
    assert len(idle.y) == state.idle_row_passes and idle.marker.pattern.shape == "/"
    starts = state.pass_starts
    first = state.rows[0]
    steps = first.run.steps
    n = len(steps)
    assert list(acc.base[:n]) == [starts[r.pass_index] for r in steps]
    assert list(acc.x[:n]) == [state.pass_seconds[r.pass_index] for r in steps]
    assert list(acc.text[:n]) == [str(len(r.token_ids)) for r in steps]
    assert fig.layout.barmode == "overlay" and list(fig.layout.yaxis.categoryarray) == ["#4", "#3", "#2", "#1"]
    by_pass = batch_viz.make_batch_timeline_figure(state, axis="pass")
    assert sorted(by_pass.data[1].base) == sorted(p for r in state.rows for p in r.idle_passes)
    assert set(by_pass.data[0].x) == {1.0}
    with pytest.raises(ValueError):
        batch_viz.make_batch_timeline_figure(state, axis="tokens")
    assert batch_viz.make_batch_timeline_figure(None).data[0].y in (None, ())


def test_comparison_table_and_export_page(tiny_lm, batch):
    state, _, _ = batch
    assert "runs after the batch" in batch_viz.render_comparison_html(None)
    comp = final(measure_comparison(tiny_lm, state, IDLE_CFG))
    html = batch_viz.render_comparison_html(comp)
    parsed = Tags(html)
    table = [a for t, a in parsed.tags if t == "table"][0]
    assert table["id"] == "batch-compare-table"
    assert parsed.tags[0][1]["data-same-as-alone"] == "true" and parsed.tags[0][1]["data-complete"] == "true"
    assert html.count("<tr>") == 4 and "AR at the same batch size" in html
    page = batch_viz.standalone_batch_html(state, comp, "t", "s")
    assert page.startswith("<!DOCTYPE html>") and page.count('class="mars-row"') == 4
    assert "batch-compare-table" in page and ".mars-idle" in page


def test_the_tabs_default_batch_shows_a_row_idling_at_a_cache_block_end():
    """Issue 55 item 6c: the Batch tab's defaults (prompts and settings) on the default model, built as the tab's
    run handler builds them (mars.app.tabs.make_batch_runner), leave some row waiting at a cache-block end."""
    from mars.app import inputs
    from mars.app.tabs import DEFAULTS, EXAMPLE_PROMPTS
    from mars.models.loading import load

    lm = load()  # the default model with the shipped adapter, as the app serves it
    d = DEFAULTS
    cfg = inputs.make_config("mars", d["tau"], d["block_size"], d["max_new_tokens"], "prob", top_k=0,
                             cache_block=d["cache_block"])
    prompts = parse_batch_prompts(EXAMPLE_PROMPTS, inputs.check_prompt)
    state = final(run_batch(lm, prompts, [inputs.encode_checked(lm, p, cfg) for p in prompts], cfg))
    idle = [r for r in state.rows if r.idle_passes]
    assert idle, [(r.run.tokens, r.run.passes) for r in state.rows]
    # idling is waiting for the others: while a row idles, another is still filling the block
    for r in idle:
        for i in r.idle_passes:
            assert any(rec.pass_index == i for o in state.rows if o is not r for rec in o.run.steps)
