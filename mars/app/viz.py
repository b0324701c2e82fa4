"""What the app draws: coloured pass groups (HTML) and plotly figures, as pure functions.

The decoder core emits meaning (pass index, accepted tokens, confidences, tau); this module alone picks
colours. Inputs are pass records (anything with PassRecord's attributes) or plain lists, outputs are HTML
strings or `go.Figure`s, so everything here is testable without a browser. All model and user text is
HTML-escaped before it is placed in markup.
"""

from __future__ import annotations

import html
import re
from typing import Callable, Sequence

import plotly.graph_objects as go

# Two colour-blind-safe sequential families (ColorBrewer Blues / Oranges; blue vs orange stays distinct
# under protanopia, deuteranopia and tritanopia). Consecutive passes alternate families; the shade
# deepens with the number of tokens the pass accepted: index = min(size, 4) - 1.
SHADES = {
    "blue": ("#dbe9f6", "#9ecae1", "#4a98c9", "#1c5a99"),
    "orange": ("#fde5cc", "#fdae6b", "#f07d2a", "#a63603"),
}
FAMILIES = ("blue", "orange")
DARK_TEXT_FROM = 2  # shade index from which text turns white, for contrast
MARS_COLOR = "#0072B2"  # Okabe-Ito blue
AR_COLOR = "#D55E00"  # Okabe-Ito vermillion
TAU_COLOR = "#222222"

GROUPS_CSS = """
.mars-text { white-space: pre-wrap; word-wrap: break-word; font-family: ui-monospace, SFMono-Regular, Menlo,
  Consolas, monospace; font-size: 15px; line-height: 1.75; padding: 10px 12px; min-height: 6em;
  border: 1px solid #d0d7de; border-radius: 8px; background: #ffffff; color: #111111; }
.mars-group { border-radius: 3px; padding: 1px 0; box-decoration-break: clone; -webkit-box-decoration-break: clone; }
.mars-group:hover { outline: 2px solid #111111; }
.mars-end { color: #777777; font-size: 0.8em; }
.mars-placeholder { color: #888888; font-style: italic; }
.mars-legend { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; font-size: 13px; }
.mars-swatch { display: inline-block; min-width: 1.6em; text-align: center; border-radius: 3px; padding: 0 4px;
  font-family: ui-monospace, monospace; }
.mars-stats { display: flex; flex-wrap: wrap; gap: 8px; }
.mars-tile { border: 1px solid #d0d7de; border-radius: 8px; padding: 4px 8px; min-width: 5.5em; max-width: 8.5em; }
.mars-tile b { display: block; font-size: 1.25em; }
.mars-tile span { font-size: 0.8em; opacity: 0.8; }
.mars-note { font-size: 0.85em; opacity: 0.85; margin-top: 4px; }
.mars-inspect { border-collapse: collapse; font-size: 14px; width: 100%; }
.mars-inspect td, .mars-inspect th { border-bottom: 1px solid #d0d7de; padding: 4px 8px; text-align: left;
  vertical-align: top; font-family: ui-monospace, monospace; }
.mars-bar { display: inline-block; height: 0.7em; background: #0072B2; margin-right: 4px; vertical-align: middle; }
.mars-accepted { color: #0b6e4f; font-weight: bold; }
.mars-inspect tr.mars-case { outline: 2px solid #E69F00; outline-offset: -2px; background: rgba(230, 159, 0, 0.15); }
.mars-tree td span { margin-right: 0.6em; }
.mars-rejected { color: #b03a00; font-weight: bold; }
s.mars-rejected { color: #6e7781; font-weight: normal; font-size: 0.9em; text-decoration: line-through;
  user-select: none; -webkit-user-select: none; margin: 0 0.1em; }
s.mars-rejected::before { content: attr(data-draft); }
.mars-banner { border-left: 4px solid #E69F00; padding: 6px 10px; background: rgba(230, 159, 0, 0.12); }
"""


def esc(text) -> str:
    """HTML-escape anything shown from model or user text (quotes too: it may land in an attribute)."""
    return html.escape(str(text), quote=True)


def shade(pass_number: int, size: int) -> tuple[str, str]:
    """(background, text colour) of the group of the pass_number-th pass, accepting `size` tokens."""
    level = max(0, min(int(size), 4) - 1)
    background = SHADES[FAMILIES[pass_number % 2]][level]
    return background, ("#ffffff" if level >= DARK_TEXT_FROM else "#111111")


def plural(n: int, word: str) -> str:
    """`n word` in the right number: 1 token, 2 tokens, 1 pass, 0 passes (every count the app writes)."""
    many = word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{n} {word if n == 1 else many}"


def token_label(text: str) -> str:
    """A token as it reads in a tooltip: quotes, with newlines and tabs made visible."""
    return repr(text)


def _hover(rec, texts: Sequence[str]) -> str:
    n = len(rec.token_ids)
    lines = [f"pass {rec.pass_index} · {plural(n, 'token')} · tau {rec.tau:.2f}"]
    sent = getattr(rec, "drafts_sent", 0)
    if sent:
        lines.append(f"{max(0, sent - len(rec.rejected_token_ids))} of {plural(sent, 'draft')} verified")
    for t, c in zip(texts, rec.confidences):
        lines.append(f"{token_label(t)}  {c:.3f}")
    if rec.finish_reason:
        lines.append(f"finished: {rec.finish_reason}")
    return "\n".join(lines)


def render_group(rec, texts: Sequence[str] | None, order: int, rejected: Sequence[str] | None = None) -> str:
    """One pass's accepted tokens as one coloured span with its data attributes and tooltip; then, when
    `rejected` (texts of the drafts that failed verification, a special token's empty) holds any text, those drafts
    struck through.

    The struck drafts are drawn from an attribute by CSS (`::before { content: attr(data-draft) }`), so they
    are seen but are not part of the text: copying the output, or reading its text, gives the answer only.
    """
    size = len(rec.token_ids)
    texts = list(texts) if texts is not None else [str(t) for t in rec.token_ids]
    background, color = shade(order, size)
    body = esc(rec.text) if rec.text else '<span class="mars-end">∎</span>'
    conf = " ".join(f"{c:.3f}" for c in rec.confidences)
    group = (
        f'<span class="mars-group" data-pass="{rec.pass_index}" data-size="{size}" data-conf="{conf}" '
        f'data-tau="{rec.tau:.3f}" style="background:{background};color:{color}" '
        f'title="{esc(_hover(rec, texts))}">{body}</span>'
    )
    draft = "".join(rejected or ()).replace("\n", "↵")
    if not draft:  # no drafts, or only special tokens (their pieces are empty): nothing to strike through
        return group
    hover = "rejected by the model: " + ", ".join(
        f"{token_label(t)} {c:.3f}" for t, c in zip(rejected, rec.rejected_confidences) if t)
    return group + (f'<s class="mars-rejected" data-pass="{rec.pass_index}" data-draft="{esc(draft)}" '
                    f'title="{esc(hover)}"></s>')


def render_groups_html(
    records: Sequence, token_texts: Sequence[Sequence[str]] | None = None, placeholder: str = "", elem_class: str = "",
    rejected_texts: Sequence[Sequence[str]] | None = None,
) -> str:
    """All groups of a run, in order, inside one pre-wrap block (newlines and indentation stay readable).

    token_texts[i] holds the text of each accepted token of records[i] (for the tooltip); ids otherwise.
    rejected_texts[i], when given (verified mode), the drafts of records[i] that failed verification.
    """
    if not records:
        inner = f'<span class="mars-placeholder">{esc(placeholder)}</span>' if placeholder else ""
    else:
        inner = "".join(
            render_group(rec, token_texts[i] if token_texts is not None else None, i,
                         rejected_texts[i] if rejected_texts is not None else None)
            for i, rec in enumerate(records)
        )
    return f'<div class="mars-text {esc(elem_class)}">{inner}</div>'


def render_legend_html() -> str:
    """Colour key: the two alternating families, deeper shade = more tokens accepted in that pass."""
    parts = ['<div class="mars-legend"><span>one coloured span = one forward pass; colours alternate;</span>']
    for fam in FAMILIES:
        for level, label in enumerate(("1", "2", "3", "4+")):
            color = "#ffffff" if level >= DARK_TEXT_FROM else "#111111"
            style = f"background:{SHADES[fam][level]};color:{color}"
            parts.append(f'<span class="mars-swatch" style="{style}">{label}</span>')
    parts.append("<span>tokens accepted in the pass (hover a span for its tokens and confidences);</span>")
    parts.append('<span><s class="mars-rejected" data-draft="draft"></s> a draft the model rejected '
                 "(verified mode)</span></div>")
    return "".join(parts)


def render_stats_html(stats: dict) -> str:
    """Live numbers as tiles. `stats` comes from the app (live_stats): passes, tokens, tokens_per_pass,
    tokens_per_second, elapsed, decode_seconds, speedup (None until the AR run has been measured), state, tau, note,
    run (whose numbers: "MARS" or "AR") and race (whether AR's passes ran between them).
    Each tile says what it divides by, so a visitor can check the arithmetic: the rate is over the run's own
    decoding seconds (its passes), not the elapsed wall clock, which in a race also holds AR's passes."""

    def tile(value, label):
        return f'<div class="mars-tile"><b>{esc(value)}</b><span>{esc(label)}</span></div>'

    run = stats.get("run")  # whose numbers the tiles are
    own = f"{run}'s" if run else "the run's"
    sec = stats.get("decode_seconds", 0.0)
    decode = f"{sec:.2f}" if sec >= 1 else f"{sec:.3g}"  # enough digits to divide by: 0.0042 s, not 0.00 s
    speed = stats.get("speedup")
    speed_text = "—" if speed is None else f"{speed:.2f}×"
    tiles = [
        tile(stats.get("passes", 0), "forward passes"),
        tile(stats.get("tokens", 0), "tokens"),
        tile(f"{stats.get('tokens_per_pass', 0.0):.2f}", "tokens / pass"),
        tile(f"{stats.get('tokens_per_second', 0.0):.1f}",
             f"tokens / s ({own} {decode} s of decoding)" if "decode_seconds" in stats else "tokens / s of decoding"),
        tile(f"{stats.get('elapsed', 0.0):.2f} s",
             "elapsed (wall clock: AR's race passes too)" if stats.get("race") else "elapsed (wall clock)"),
        tile(speed_text, "speed-up vs AR (measured)"),
    ]
    tau = stats.get("tau")
    attrs = (
        f'data-state="{esc(stats.get("state", "idle"))}" data-passes="{stats.get("passes", 0)}" '
        f'data-tokens="{stats.get("tokens", 0)}" data-tau="{"" if tau is None else f"{tau:.3f}"}"'
    )
    note = stats.get("note")
    note_html = f'<div class="mars-note">{esc(note)}</div>' if note else ""
    return f'<div class="mars-stats-wrap" {attrs}><div class="mars-stats">{"".join(tiles)}</div>{note_html}</div>'


def render_inspector_html(rows: Sequence[dict], reason: str, header: str = "", marked: int | None = None) -> str:
    """The draft positions of one pass. rows: {position, token, confidence, status, candidates:[(text, p)]}.
    marked: the index of a row to pick out (the Acceptance table's draft, opened here), or None."""
    out = [f"<div>{esc(header)}</div>" if header else ""]
    out.append('<table class="mars-inspect"><tr><th>position</th><th>proposal</th><th>confidence</th>'
               "<th>status</th><th>top candidates (probability)</th></tr>")
    for i, r in enumerate(rows):
        status_class = "mars-accepted" if r["status"].startswith("accepted") else "mars-rejected"
        cands = "<br>".join(
            f'<span class="mars-bar" style="width:{max(1, round(60 * p))}px"></span>{esc(token_label(t))} {p:.3f}'
            for t, p in r.get("candidates", [])
        )
        mark = ' class="mars-case" data-case="1"' if i == marked else ""
        out.append(
            f"<tr{mark}><td>{esc(r['position'])}</td><td>{esc(token_label(r['token']))}</td>"
            f"<td>{r['confidence']:.3f}</td><td class=\"{status_class}\">{esc(r['status'])}</td><td>{cands}</td></tr>"
        )
    out.append(f'</table><div class="mars-note">chain stopped: {esc(reason)}</div>')
    return "".join(out)


def tree_rows(rec, decode: Callable[[int], str]) -> list[dict]:
    """A tree pass's candidates, one row per depth: {depth, candidates: [(text, won)], winner}; `won` marks
    the accepted path's draft at that depth (None past the path's end), then the model's own next token."""
    path = rec.tree_path or []
    out = []
    for d, cands in enumerate(rec.tree_depths or []):
        win = path[d] if d < len(path) else None
        out.append({"depth": d + 1, "candidates": [(decode(t), t == win) for t in cands],
                    "winner": decode(win) if win is not None else None})
    return out


def render_tree_html(rows: Sequence[dict], own: str | None, checked: int) -> str:
    """The draft tree of one pass: the candidates checked at each depth (likeliest first), the accepted
    path's one in bold green, and the model's own token that the pass added after the path."""
    if not rows:
        return ('<div class="mars-tree mars-note" data-depths="0">draft tree: no candidates this pass (the first '
                "pass, or none reached tau): the model's own next token only</div>")
    out = [f'<table class="mars-inspect mars-tree" data-depths="{len(rows)}" data-nodes="{checked}">'
           f"<tr><th>depth</th><th>candidates checked ({plural(checked, 'node')} in all), the accepted path's in bold</th></tr>"]
    for r in rows:
        cells = " ".join(f'<span class="mars-accepted" data-won="1">{esc(token_label(t))}</span>' if won
                         else f"<span>{esc(token_label(t))}</span>" for t, won in r["candidates"])
        out.append(f'<tr data-depth="{r["depth"]}"><td>{r["depth"]}</td><td>{cells}</td></tr>')
    path = [r["winner"] for r in rows if r["winner"] is not None]
    won = " → ".join(esc(token_label(t)) for t in path) or "(no draft)"
    tail = f" → then the model's own {esc(token_label(own))}" if own is not None else ""
    out.append(f'</table><div class="mars-note mars-tree-path">path that won: {won}{tail}</div>')
    return "".join(out)


def chain_stop_reason(rec, proposals: int, mode: str = "mars") -> str:
    """Why pass `rec` accepted no more tokens than it did."""
    n = len(rec.token_ids)
    if rec.finish_reason == "eos":
        return "the model ended its answer (EOS token)"
    if rec.finish_reason == "length":
        return "max new tokens reached"
    if rec.finish_reason == "stop":
        return "a stop string was completed"
    if mode == "verified" and getattr(rec, "tree_depths", None) and rec.drafts_sent:
        d = len(rec.tree_path or []) + 1
        if d > len(rec.tree_depths):
            return f"the path reached the tree's deepest candidate ({d - 1}), plus the model's own next token"
        return (f"at depth {d} no candidate under the accepted path is the model's own choice: the model's token "
                "takes its place")
    if mode == "verified":
        if rec.drafts_sent == 0:
            return "no drafts to check (none reached tau, or the first pass): the model's own next token only"
        if rec.rejected_token_ids:
            return (f"draft {n} differs from the model's own choice: it and the drafts after it are dropped, "
                    "the model's token takes its place")
        return ("the draft verified" if rec.drafts_sent == 1 else f"all {rec.drafts_sent} drafts verified") + \
            ", plus the model's own next token"
    if proposals == 1:
        return "AR mode: one token per pass"
    if n >= proposals:
        return f"all {proposals} proposals accepted: the window ends here"
    if rec.tau >= 1.0:
        return "tau = 1: only the AR token is accepted (plain AR decoding)"
    if rec.repeat_guard:
        conf = f"confidence {rec.rejected_confidences[0]:.3f} reached tau {rec.tau:.2f}, but " if rec.rejected_confidences else ""
        return (f"repeat guard: the draft at position {n} repeats the word(s) just before it; {conf}a repeat "
                "must clear the higher repeat bar, so it waits for the next pass")
    if rec.rejected_confidences and rec.rejected_confidences[0] < rec.tau:
        return f"position {n}: confidence {rec.rejected_confidences[0]:.3f} is below tau {rec.tau:.2f}"
    return "the cap on tokens per pass"


def inspector_rows(rec, decode: Callable[[int], str], mode: str = "mars") -> list[dict]:
    """One row per proposal of the pass: its token, confidence, status and top candidates.

    MARS: the AR token, then the masks. Verified: the drafts fed in (the model's own confidence for the
    verified ones, the draft's for the rejected), then the model's own token at the first mismatch.
    """
    n = len(rec.token_ids)
    proposals = rec.token_ids + rec.rejected_token_ids
    confs = rec.confidences + rec.rejected_confidences
    rows = []
    for j, (tok, conf) in enumerate(zip(proposals, confs)):
        # verified: candidate row j is the model's choice after input j, meaningful up to the first mismatch
        has_cands = rec.candidates and j < len(rec.candidates) and (mode != "verified" or j < n)
        cands = [(decode(c), p) for c, p in (rec.candidates[j] if has_cands else [])]
        if mode == "verified":
            position = "model's token" if j == n - 1 else f"draft {j + 1 if j < n else j}"
            status = ("accepted" if j == n - 1 else "accepted: verified" if j < n else
                      "rejected: not the model's choice" if j == n else "dropped (after the mismatch)")
        else:
            position = "AR token (0)" if j == 0 else f"mask +{j}"
            stop = "rejected by the repeat guard: chain stops here" if rec.repeat_guard \
                else "rejected: chain stops here"
            status = "accepted" if j < n else (stop if j == n else "dropped (after the stop)")
        rows.append({"position": position, "token": decode(tok), "confidence": conf, "status": status,
                     "candidates": cands})
    return rows


def mode_name(mode: str) -> str:
    return {"mars": "MARS", "verified": "Verified MARS", "ar": "AR"}.get(mode, mode)


def summary_line(mars, ar=None) -> str:
    """One sentence on a finished run (a RunRecord) and its AR baseline."""
    s = (f"{mode_name(mars.config.mode)}: {plural(mars.tokens, 'token')} in {plural(mars.passes, 'forward pass')} "
         f"({mars.tokens_per_pass:.2f} tokens/pass), "
         f"{mars.decode_seconds:.2f} s of decoding")
    if ar is not None and ar.finished:
        s += f"; AR: {plural(ar.tokens, 'token')} in {plural(ar.passes, 'pass')}, {ar.decode_seconds:.2f} s"
    return s + "."


def live_stats(mars, ar, state: str, tau: float | None, note: str = "") -> dict:
    """The numbers shown while a run goes (for `render_stats_html`); the speed-up is measured: AR decode
    seconds per token over MARS decode seconds per token, so a stopped or shorter run still compares fairly."""
    t = mars or ar
    if t is None:
        return {"state": state, "tau": tau, "note": note}
    speedup = None
    if mars and ar and ar.finished and mars.finished and mars.decode_seconds > 0 and ar.tokens:
        speedup = (ar.decode_seconds / ar.tokens) / (mars.decode_seconds / max(1, mars.tokens))
    return {
        "passes": t.passes, "tokens": t.tokens, "tokens_per_pass": t.tokens_per_pass,
        "tokens_per_second": t.tokens_per_second, "elapsed": t.elapsed, "decode_seconds": t.decode_seconds,
        "speedup": speedup, "state": state, "tau": tau, "note": note, "run": "MARS" if mars else "AR",
        "race": bool(mars and ar),
    }


_PATH = re.compile(r"(?<![\w.:/])(?:~|/)[^\s'\"]*/([^\s'\"/]+)")  # an absolute path: /a/b/name -> name


def hide_paths(text: str) -> str:
    """Text for visitors: every absolute path on this server cut to its last part (a folder's name)."""
    return _PATH.sub(lambda m: m.group(1), text)


def render_model_html(rows: Sequence[tuple[str, object]], notes: Sequence[str]) -> tuple[str, str]:
    """(one-line banner, full table) of the model panel; notes become banners under both."""
    banners = "".join(f'<div class="mars-banner">{esc(n)}</div>' for n in notes)
    line = " · ".join(f"{esc(k)}: <b>{esc(v)}</b>" for k, v in rows[:4])
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<div class="mars-note">{line}</div>{banners}', f'<table class="mars-inspect">{table}</table>{banners}'


def render_table_html(headers: Sequence[str], rows: Sequence[Sequence], elem_id: str = "") -> str:
    """A plain table; cells are escaped, floats shown with 3 decimals."""
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else esc(v)

    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    ident = f' id="{esc(elem_id)}"' if elem_id else ""
    return f'<table class="mars-inspect"{ident}><tr>{head}</tr>{body}</table>'


def standalone_html(records: Sequence, token_texts, title: str, prompt: str, summary: str,
                    rejected_texts: Sequence[Sequence[str]] | None = None) -> str:
    """A self-contained HTML page of a coloured generation, for slides and sharing."""
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>body{{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;"
        f"padding:0 1em;color:#111}} .prompt{{white-space:pre-wrap;background:#f4f4f4;padding:8px;border-radius:6px}}"
        f"{GROUPS_CSS}</style></head><body>"
        f"<h2>{esc(title)}</h2><p><b>Prompt</b></p><div class=\"prompt\">{esc(prompt)}</div>"
        f"<p><b>Generation</b></p>{render_groups_html(records, token_texts, rejected_texts=rejected_texts)}"
        f"<p>{render_legend_html()}</p>"
        f"<p class=\"mars-note\">{esc(summary)}</p></body></html>"
    )


# ----------------------------------------------------------------------------------------------- figures
# Figures are built from plain dicts in one go.Figure call: update_layout / make_subplots / named templates
# each cost 3-25 ms of validation, and the charts are rebuilt while a run streams.

_AXIS = dict(showgrid=True, gridcolor="#e6e6e6", zeroline=False, linecolor="#888888", ticks="outside",
             tickcolor="#888888", automargin=True)


def _figure(traces: list, title: str, height: int = 290, **layout) -> go.Figure:
    base = dict(
        title=dict(text=title, font=dict(size=14)),
        template="none",
        font=dict(family="system-ui, sans-serif", size=12, color="#222222"),
        paper_bgcolor="#ffffff",
        plot_bgcolor="#ffffff",
        height=height,
        margin=dict(l=50, r=15, t=40, b=80),
        # below the x axis title: a legend on top collides with the title in a narrow side panel
        legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="center", x=0.5, font=dict(size=11)),
    )
    for key, value in layout.items():
        base[key] = {**_AXIS, **value} if key.startswith(("xaxis", "yaxis")) else value
    for axis in ("xaxis", "yaxis"):
        base.setdefault(axis, dict(_AXIS))
    return go.Figure(data=traces, layout=base)


def _two_panels(left_title: str, right_title: str, gap: float = 0.12) -> dict:
    """Layout for two side-by-side panels (x/y left, x2/y2 right), without make_subplots' cost."""
    half = (1 - gap) / 2
    note = dict(xref="paper", yref="paper", y=1.0, yanchor="bottom", showarrow=False, font=dict(size=12))
    return dict(
        xaxis=dict(domain=[0, half], anchor="y"), yaxis=dict(anchor="x"),
        xaxis2=dict(domain=[1 - half, 1], anchor="y2"), yaxis2=dict(anchor="x2"),
        annotations=[dict(text=t, x=x, **note) for t, x in ((left_title, half / 2), (right_title, 1 - half / 2)) if t],
    )


EMPTY_PASSES = 10  # the pass axis of a chart with no run yet: 0..10 passes, not plotly's -1..1 around nothing


def _no_run(layout: dict, text: str = "no run yet: press Generate", x: float = 0.5) -> dict:
    """`layout` with a grey note in the middle of an empty chart (at paper x), beside any annotations it has."""
    note = dict(text=text, xref="paper", yref="paper", x=x, y=0.5, xanchor="center", showarrow=False,
                font=dict(size=13, color="#888888"))
    return {**layout, "annotations": [*layout.get("annotations", []), note]}


def make_tokens_per_pass_figure(run, block_size: int | None = None) -> go.Figure:
    """Tokens accepted by each forward pass of a run (a RunRecord; None, or no pass yet: an empty chart), with
    AR's constant 1 token per pass for reference; the title's mean is the run's own tokens_per_pass. With no
    run the title names no B: the page's B slider may say another (the mode's and the model's B)."""
    sizes = [len(s.token_ids) for s in run.steps] if run is not None else []
    passes = list(range(len(sizes)))
    end = len(sizes) - 0.5 if sizes else EMPTY_PASSES
    traces = [
        go.Bar(x=passes, y=list(sizes), name="MARS", marker_color=MARS_COLOR,
               hovertemplate="pass %{x}: %{y} tokens<extra></extra>"),
        go.Scatter(x=[-0.5 if sizes else 0, end], y=[1, 1], mode="lines", name="AR baseline (1)",
                   line=dict(color=AR_COLOR, dash="dash")),
    ]
    if not sizes:
        return _figure(traces, "Tokens per pass", **_no_run(dict(
            yaxis=dict(range=[0, 4.5], dtick=1, title=dict(text="tokens")),
            xaxis=dict(range=[0, EMPTY_PASSES], title=dict(text="forward pass")))))
    top = max([block_size or 1, *sizes])  # a verified pass (a draft tree, an n-gram copy) can accept more than B
    b = f", B = {block_size}" if block_size else ""
    return _figure(traces, f"Tokens per pass (mean {run.tokens_per_pass:.2f}{b})",
                   yaxis=dict(range=[0, top + 0.5], dtick=1, title=dict(text="tokens")),
                   xaxis=dict(title=dict(text="forward pass")))


def make_confidence_figure(records: Sequence) -> go.Figure:
    """Confidence of every proposal of every pass against tau.

    Position 0 of a pass is the AR token, always accepted whatever its confidence (hollow grey); the masks
    at positions 1.. are accepted (blue dots) while confidence >= tau, the rest rejected (crosses).
    """
    pts = {"ar": ([], [], []), "acc": ([], [], []), "rej": ([], [], [])}
    for rec in records:
        n = len(rec.confidences)
        for j, c in enumerate(list(rec.confidences) + list(rec.rejected_confidences)):
            kind = "ar" if j == 0 else ("acc" if j < n else "rej")
            x, y, t = pts[kind]
            x.append(rec.pass_index), y.append(c), t.append(f"position {j}")

    def scatter(kind, name, marker):
        x, y, t = pts[kind]
        return go.Scatter(x=x, y=y, text=t, mode="markers", name=name, marker=marker,
                          hovertemplate=f"pass %{{x}} · %{{text}}: %{{y:.3f}}<extra>{name}</extra>")

    traces = [
        scatter("ar", "AR token", dict(color="rgba(0,0,0,0)", size=7, line=dict(color="#777777", width=1.5))),
        scatter("acc", "accepted mask", dict(color=MARS_COLOR, size=8, symbol="circle")),
        scatter("rej", "rejected mask", dict(color=AR_COLOR, size=8, symbol="x")),
        go.Scatter(x=[r.pass_index for r in records], y=[r.tau for r in records], mode="lines", name="tau",
                   line=dict(color=TAU_COLOR, dash="dot", shape="hvh")),
    ]
    layout = dict(yaxis=dict(range=[-0.03, 1.03], title=dict(text="confidence")),
                  xaxis=dict(title=dict(text="forward pass")))
    if not records:
        layout["xaxis"]["range"] = [0, EMPTY_PASSES]
        layout = _no_run(layout)
    return _figure(traces, "Confidence of each proposal vs tau", **layout)


def cumulative(records: Sequence) -> tuple[list[int], list[int], list[float]]:
    """(passes, tokens, seconds), cumulative, starting from (0, 0, 0)."""
    passes, tokens, seconds = [0], [0], [0.0]
    for rec in records:
        passes.append(passes[-1] + 1)
        tokens.append(tokens[-1] + len(rec.token_ids))
        seconds.append(seconds[-1] + rec.seconds)
    return passes, tokens, seconds


def make_race_figure(mars: Sequence, ar: Sequence | None = None) -> go.Figure:
    """The race: cumulative tokens vs forward passes (left) and vs decode seconds (right), MARS vs AR.

    Before the AR run exists, the left panel shows AR's known 1 token per pass as a dashed reference.
    """
    mp, mt, ms = cumulative(mars)
    line = dict(color=MARS_COLOR, width=3)
    traces = [go.Scatter(x=mp, y=mt, mode="lines", name="MARS", line=line),
              go.Scatter(x=ms, y=mt, mode="lines", name="MARS", line=line, showlegend=False, xaxis="x2", yaxis="y2")]
    if ar:
        ap, at, as_ = cumulative(ar)
        line = dict(color=AR_COLOR, width=3)
        traces += [go.Scatter(x=ap, y=at, mode="lines", name="AR", line=line),
                   go.Scatter(x=as_, y=at, mode="lines", name="AR", line=line, showlegend=False,
                              xaxis="x2", yaxis="y2")]
    else:
        top = max(mt[-1], 1) if mars else EMPTY_PASSES
        traces.append(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="AR (1 token/pass)",
                                 line=dict(color=AR_COLOR, dash="dash")))
    layout = _two_panels("", "")  # the axis titles name the panels
    layout["xaxis"]["title"] = dict(text="forward passes")
    layout["xaxis2"]["title"] = dict(text="seconds (decode)")
    layout["yaxis"]["title"] = dict(text="tokens")
    if not mars and not ar:  # no run yet: 0..10 passes and tokens, 0..1 s, not -1..1 around the origin
        for axis, end in (("xaxis", EMPTY_PASSES), ("yaxis", EMPTY_PASSES), ("xaxis2", 1), ("yaxis2", EMPTY_PASSES)):
            layout[axis]["range"] = [0, end]
        layout = _no_run(layout, "no run yet", x=0.78)  # the right panel: the left has the AR line and legend
    return _figure(traces, "The race: MARS vs AR", height=290, margin=dict(l=50, r=15, t=50, b=45),
                   legend=dict(x=0.01, y=0.98, xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.75)"),
                   **layout)


def make_mask_heatmap(length: int, block_size: int, noisy_start: int = 0) -> go.Figure:
    """The training attention mask over [clean | noisy] (masks.mars_attention_mask), rows = queries."""
    from mars.decoding.masks import mars_attention_mask

    mask = mars_attention_mask(length, block_size, noisy_start).int().tolist()  # (2L - s, 2L - s)
    labels = [f"c{t}" for t in range(length)] + [f"n{t}" for t in range(noisy_start, length)]
    hover = [
        [f"query {q} → key {k}: {'attends' if mask[i][j] else 'blocked'}" for j, k in enumerate(labels)]
        for i, q in enumerate(labels)
    ]
    heat = go.Heatmap(z=mask, x=labels, y=labels, text=hover, hoverinfo="text", showscale=False, xgap=1, ygap=1,
                      colorscale=[[0, "#f0f0f0"], [1, MARS_COLOR]], zmin=0, zmax=1)
    edge, end = length - 0.5, len(labels) - 0.5  # the clean | noisy seam
    seam = dict(type="line", line=dict(color=AR_COLOR, width=2))
    shapes = [dict(x0=edge, x1=edge, y0=-0.5, y1=end, **seam), dict(y0=edge, y1=edge, x0=-0.5, x1=end, **seam)]
    block = dict(type="line", line=dict(color="#999999", width=1, dash="dot"))
    bounds = [b - 0.5 for b in range(block_size, length, block_size)]  # block edges in the clean copy
    bounds += [length + b - noisy_start - 0.5 for b in range(noisy_start + block_size, length, block_size)]
    for b in bounds:
        shapes += [dict(x0=b, x1=b, y0=-0.5, y1=end, **block), dict(y0=b, y1=b, x0=-0.5, x1=end, **block)]
    title = (f"Training mask, L = {length}, B = {block_size}: rows = queries, columns = keys; "
             "c = clean copy, n = noisy (masked) copy; blue = attends; dotted = block edges")
    return _figure([heat], title, height=560, margin=dict(l=60, r=15, t=80, b=30), shapes=shapes,
                   yaxis=dict(autorange="reversed", showgrid=False), xaxis=dict(side="top", showgrid=False))


def _point_labels(rows: Sequence[dict], key: str) -> list[str]:
    """"τ=0.9" per point; points that coincide share one label ("τ=1, 0.9") instead of overprinting, and a tau
    swept twice is named once: its second point lands on or next to its first, so a second label would overprint."""
    labels, first, named = [""] * len(rows), {}, set()
    for i, r in enumerate(rows):
        tau = f"{r['tau']:g}"
        if tau in named:
            continue
        named.add(tau)
        spot = (round(r["tokens_per_pass"], 3), round(r[key], 3))
        if spot in first:
            labels[first[spot]] += f", {tau}"
        else:
            first[spot] = i
            labels[i] = f"τ={tau}"
    return labels


def _label_positions(labels: Sequence[str]) -> list[str]:
    """Above and below the points in turn (counting labelled points only): neighbouring taus' labels, close
    together at the top of the agreement panel, no longer print over each other."""
    out, k = [], 0
    for label in labels:
        out.append("top center" if k % 2 == 0 else "bottom center")
        k += bool(label)
    return out


def make_sweep_figure(rows: Sequence[dict], block_size: int | None = None) -> go.Figure:
    """tau sweep: tokens per pass against agreement with AR (left) and the AR model's mean NLL (right).

    rows: {tau, tokens_per_pass, agreement, nll}; one point per tau, labelled with it. block_size: the B the
    sweep ran at (the Generate tab's), named in the title.
    """
    x = [r["tokens_per_pass"] for r in rows]
    traces = []
    for axis, key in (("", "agreement"), ("2", "nll")):
        labels = _point_labels(rows, key)
        traces.append(go.Scatter(
            x=x, y=[r[key] for r in rows], text=labels, mode="markers+text+lines",
            textposition=_label_positions(labels), customdata=[r["tau"] for r in rows],  # an unlabelled point's tau
            marker=dict(color=MARS_COLOR, size=9), line=dict(color=MARS_COLOR, dash="dot"), showlegend=False,
            hovertemplate="τ=%{customdata:g}: %{x:.2f} tokens/pass, %{y:.3f}<extra></extra>", xaxis="x" + axis,
            yaxis="y" + axis,
        ))
    layout = _two_panels("agreement with AR (exact prefix)", "mean NLL under the AR model (nats/token)", gap=0.14)
    for axis in ("xaxis", "xaxis2"):
        layout[axis]["title"] = dict(text="tokens per pass")
    layout["yaxis"]["range"] = [-0.05, 1.1]
    if not rows:  # no sweep yet: 0..4 tokens per pass and 0..3 NLL, not -1..1 around nothing
        layout["xaxis"]["range"] = layout["xaxis2"]["range"] = [0, 4]
        layout["yaxis2"]["range"] = [0, 3]
        layout = _no_run(layout, "no sweep yet: press Sweep τ", x=0.22)
    at = f" at B = {block_size}" if block_size else ""
    return _figure(traces, f"Sweeping tau{at}: speed against quality", height=340,
                   margin=dict(l=50, r=15, t=75, b=45), **layout)
