"""What the Batch tab draws: one row of coloured pass groups per prompt, the shared time axis, the comparison.

Pure functions from a `mars.app.batch.BatchState` / `BatchComparison` to HTML strings and `go.Figure`s.
Each row's groups are drawn by `viz.render_group`, so they carry the main output's data attributes
(data-pass, data-size, data-conf, data-tau) and colours. All model and user text is escaped.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from mars.app import viz

IDLE_COLOR = "#bbbbbb"

BATCH_CSS = """
.mars-batch { display: flex; flex-direction: column; gap: 8px; }
.mars-row { border: 1px solid #d0d7de; border-radius: 8px; padding: 4px 6px; background: #ffffff; }
.mars-row[data-state="finished"] { border-color: #8fbf9f; }
.mars-row[data-state="idle"] { border-style: dashed; }
.mars-row-head { font-size: 12px; color: #444444; display: flex; gap: 10px; flex-wrap: wrap; margin-bottom: 2px; }
.mars-row-head b { color: #111111; }
.mars-row .mars-text { min-height: 2em; max-height: 12em; overflow-y: auto; padding: 4px 8px; font-size: 14px; }
.mars-idle { display: inline-block; color: #555555; background: repeating-linear-gradient(45deg, #eeeeee, #eeeeee 3px,
  #d6d6d6 3px, #d6d6d6 6px); border-radius: 3px; padding: 0 3px; margin: 0 1px; font-size: 0.8em;
  user-select: none; -webkit-user-select: none; }
.mars-idle::before { content: attr(data-label); }
"""


def _runs(indices: Sequence[int]) -> list[list[int]]:
    """Consecutive pass indices grouped: [3, 4, 5, 9] -> [[3, 4, 5], [9]]."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _idle_marker(passes: list[int]) -> str:
    """A stretch of idle passes. Its label is drawn from an attribute by CSS, so the row's text (what a
    reader copies) stays the answer alone."""
    n = len(passes)
    label = f"‖{n}" if n > 1 else "‖"
    span = f"pass {passes[0]}" if n == 1 else f"passes {passes[0]}–{passes[-1]}"
    title = f"idle for {n} pass{'es' if n != 1 else ''} ({span}): waiting at the cache-block end for the other rows"
    return (f'<span class="mars-idle" data-passes="{" ".join(map(str, passes))}" data-count="{n}" '
            f'data-label="{label}" title="{viz.esc(title)}"></span>')


def row_state(row, batch_passes: int) -> str:
    """"finished", "idle" (its latest batch pass was spent waiting at a block end) or "decoding"."""
    if row.finished:
        return "finished"
    if row.idle_passes and row.idle_passes[-1] == batch_passes - 1:
        return "idle"
    return "decoding"


def render_row_html(row, batch_passes: int, prompt_chars: int = 90) -> str:
    """One prompt's row: a header (number, state, counts, the prompt) and its groups and idle stretches in
    pass order; group k of the row takes the k-th colour of the alternation, as in the main output."""
    run = row.run
    events = [(rec.pass_index, "group", k) for k, rec in enumerate(run.steps)]
    events += [(stretch[0], "idle", stretch) for stretch in _runs(row.idle_passes)]
    parts = []
    for _, kind, what in sorted(events, key=lambda e: e[0]):
        if kind == "group":
            parts.append(viz.render_group(run.steps[what], row.token_texts[what], what))
        else:
            parts.append(_idle_marker(what))
    state = row_state(row, batch_passes)
    status = f"finished: {run.finish_reason}" if row.finished else state
    prompt = row.prompt if len(row.prompt) <= prompt_chars else row.prompt[: prompt_chars - 1] + "…"
    head = (f'<div class="mars-row-head"><b>#{row.index + 1}</b><span>{viz.esc(status)}</span>'
            f"<span>{viz.plural(run.tokens, 'token')} · {viz.plural(run.passes, 'pass')} · {len(row.idle_passes)} idle · "
            f"{run.tokens_per_pass:.2f} tokens/pass</span>"
            f'<span class="mars-row-prompt" title="{viz.esc(row.prompt)}">{viz.esc(prompt)}</span></div>')
    attrs = (f'data-row="{row.index}" data-state="{state}" data-tokens="{run.tokens}" '
             f'data-passes="{run.passes}" data-idle="{len(row.idle_passes)}"')
    return f'<div class="mars-row" {attrs}>{head}<div class="mars-text">{"".join(parts)}</div></div>'


def render_batch_html(state, placeholder: str = "") -> str:
    """The whole batch: one `.mars-row` per prompt, in prompt order (the app gives it elem_id batch-output)."""
    if state is None or not state.rows:
        inner = f'<span class="mars-placeholder">{viz.esc(placeholder)}</span>' if placeholder else ""
        return f'<div class="mars-batch" data-rows="0" data-passes="0" data-state="idle">{inner}</div>'
    rows = "".join(render_row_html(r, state.batch_passes) for r in state.rows)
    attrs = (f'data-rows="{len(state.rows)}" data-passes="{state.batch_passes}" '
             f'data-state="{"done" if state.done else "running"}" data-idle="{state.idle_row_passes}"')
    return f'<div class="mars-batch" {attrs}>{rows}</div>'


def render_batch_legend_html() -> str:
    return (viz.render_legend_html()
            + '<div class="mars-legend"><span class="mars-idle" data-label="‖3"></span><span>a row idling for that '
              "many passes at a cache-block end, until every row has filled the block (the paper's Figure 4)</span>"
              "</div>")


def make_batch_timeline_figure(state, axis: str = "time") -> go.Figure:
    """Every row's passes on one shared axis: a bar per pass (coloured and labelled by the tokens it
    accepted, in the row's own colours) and grey hatched bars for passes spent idle at a block end.

    axis: "time" (seconds of decoding, each pass as long as it took) or "pass" (one unit per pass).
    """
    if axis not in ("time", "pass"):
        raise ValueError(f"axis must be 'time' or 'pass', got {axis!r}")
    rows = state.rows if state is not None else []
    starts = state.pass_starts if state is not None else []
    seconds = state.pass_seconds if state is not None else []

    def span(p):
        return (starts[p], seconds[p]) if axis == "time" else (p, 1.0)

    acc = dict(y=[], base=[], x=[], color=[], text=[], hover=[])
    idle = dict(y=[], base=[], x=[], hover=[])
    labels = [f"#{r.index + 1}" for r in rows]
    for r, label in zip(rows, labels):
        for k, rec in enumerate(r.run.steps):
            b, w = span(rec.pass_index)
            n = len(rec.token_ids)
            acc["y"].append(label), acc["base"].append(b), acc["x"].append(w)
            acc["color"].append(viz.shade(k, n)[0]), acc["text"].append(str(n))
            acc["hover"].append(f"row {label} · pass {rec.pass_index} · {viz.plural(n, 'token')} · "
                                f"{rec.seconds * 1000:.0f} ms")
        for p in r.idle_passes:
            b, w = span(p)
            idle["y"].append(label), idle["base"].append(b), idle["x"].append(w)
            idle["hover"].append(f"row {label} · pass {p} · idle at the cache-block end")
    line = dict(color="#ffffff", width=0.5)
    traces = [
        go.Bar(orientation="h", y=acc["y"], x=acc["x"], base=acc["base"], name="tokens accepted in the pass",
               marker=dict(color=acc["color"], line=line), text=acc["text"], textposition="inside",
               insidetextanchor="middle", customdata=acc["hover"], hovertemplate="%{customdata}<extra></extra>"),
        go.Bar(orientation="h", y=idle["y"], x=idle["x"], base=idle["base"], name="idle at a cache-block end",
               marker=dict(color=IDLE_COLOR, pattern=dict(shape="/", fgcolor="#888888"), line=line),
               customdata=idle["hover"], hovertemplate="%{customdata}<extra></extra>"),
    ]
    totals = state.totals if rows else None
    title = (f"Batch of {len(rows)}: {viz.plural(state.batch_passes, 'pass')}, {viz.plural(totals.tokens, 'token')} "
             f"({totals.tokens_per_batch_pass:.2f} per pass)") if rows else "Batch: passes on a shared time axis"
    x_title = "seconds of decoding (shared by all rows)" if axis == "time" else "pass (shared by all rows)"
    height = max(240, 110 + 34 * len(rows))
    plot_px = height - 40 - 110  # the plot area between the margins below
    # the legend goes under the x axis title at a fixed distance in pixels: legend y is in plot fractions
    legend = dict(orientation="h", yanchor="top", y=-62 / plot_px, xanchor="center", x=0.5, font=dict(size=11))
    return viz._figure(traces, title, height=height, barmode="overlay", bargap=0.25, legend=legend,
                       margin=dict(l=50, r=15, t=40, b=110),
                       xaxis=dict(title=dict(text=x_title), rangemode="tozero"),
                       yaxis=dict(categoryorder="array", categoryarray=labels[::-1], title=dict(text="row")))


def render_comparison_html(comp) -> str:
    """The measured comparison as a table (elem id batch-compare-table) and a one-line verdict."""
    if comp is None:
        return '<div class="mars-note">The comparison runs after the batch: each prompt alone, then AR.</div>'
    headers = ["run", "batch size", "batch passes", "tokens", "tokens / batch pass", "tokens / pass",
               "seconds", "tokens / s"]
    rows = [[r.label, r.batch_size, r.totals.batch_passes, r.totals.tokens, r.totals.tokens_per_batch_pass,
             r.totals.tokens_per_pass, r.totals.batch_seconds, r.totals.tokens_per_second] for r in comp.runs]
    table = viz.render_table_html(headers, rows, elem_id="batch-compare-table")
    notes = []
    for name, other in (("one at a time", comp.one_at_a_time), ("AR at the same batch size", comp.ar_batch)):
        s = comp.speedup(other)
        if s is not None:
            notes.append(f"{s:.2f}× the speed of {name} (measured seconds per token)")
    if comp.same_as_alone is not None:
        notes.append("every row's output is identical to its prompt decoded alone" if comp.same_as_alone else
                     "WARNING: a row's output differs from its prompt decoded alone")
    waiting = [] if comp.ar_batch else ["running the remaining comparison…"]
    attrs = (f'data-same-as-alone="{"" if comp.same_as_alone is None else str(comp.same_as_alone).lower()}" '
             f'data-complete="{"true" if comp.ar_batch else "false"}"')
    return (f'<div class="mars-batch-compare" {attrs}>{table}'
            f'<div class="mars-note">{viz.esc("; ".join(notes + waiting))}</div></div>')


def standalone_batch_html(state, comp, title: str, summary: str = "") -> str:
    """A self-contained page of a batch run (rows, legend, comparison table), for slides and sharing."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{viz.esc(title)}</title><style>body{{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;"
        f"padding:0 1em;color:#111}}{viz.GROUPS_CSS}{BATCH_CSS}</style></head><body>"
        f"<h2>{viz.esc(title)}</h2>{render_batch_html(state)}<p>{render_batch_legend_html()}</p>"
        f"{render_comparison_html(comp) if comp is not None else ''}"
        f'<p class="mars-note">{viz.esc(summary)}</p></body></html>'
    )
