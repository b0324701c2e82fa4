"""What the Acceptance tab draws, as pure functions of the lab's result (mars.evaluation.acceptance_lab.run_lab's
data): four plotly figures and the table of extremes. None (no result yet) gives an empty figure with a hint.

Variants keep one colour each everywhere: the model as loaded (with its adapter) in MARS blue, the bare
model in grey (what training started from); confidence dashed beside accuracy solid."""

from __future__ import annotations

import plotly.graph_objects as go

from mars.app.accept_inspect import case_key
from mars.app.viz import MARS_COLOR, _figure, esc

COLORS = {"model": MARS_COLOR, "bare": "#7f7f7f"}
MEASURED_COLOR = "#D55E00"  # Okabe-Ito vermillion: what decoding measured
NAMES = {"model": "with adapter", "bare": "bare (adapter off)"}
_HINT = dict(text="press Analyse", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
             font=dict(size=13, color="#888888"))


def _variants(result: dict | None) -> list[tuple[str, dict]]:
    return list((result or {}).get("variants", {}).items())


def make_reliability_figure(result: dict | None) -> go.Figure:
    """One panel per mask depth: each confidence bin's mean confidence against its share of right drafts (marker
    size ~ drafts in the bin, hover: the count), the diagonal of perfect calibration, the ECE in the title."""
    variants = _variants(result)
    depths = [d["depth"] for d in variants[0][1]["depths"]] if variants else [1, 2, 3]
    n = max(1, len(depths))
    gap = 0.04
    width = (1 - gap * (n - 1)) / n
    layout, traces, notes = {}, [], []
    for i, depth in enumerate(depths):
        k = "" if i == 0 else str(i + 1)
        x0 = i * (width + gap)
        layout[f"xaxis{k}"] = dict(domain=[x0, x0 + width], range=[0, 1], anchor=f"y{k}", title=dict(text="confidence"))
        layout[f"yaxis{k}"] = dict(range=[0, 1.02], anchor=f"x{k}", showticklabels=i == 0,
                                   **({"title": dict(text="share right")} if i == 0 else {}))
        traces.append(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#bbbbbb", dash="dot", width=1),
                                 hoverinfo="skip", showlegend=False, xaxis=f"x{k}", yaxis=f"y{k}"))
        eces = []
        for v, a in variants:
            d = next((d for d in a["depths"] if d["depth"] == depth), None)
            if d is None:
                continue
            pts = [b for b in d["bins"] if b["count"]]
            most = max([b["count"] for b in pts] or [1])
            traces.append(go.Scatter(
                x=[b["confidence"] for b in pts], y=[b["accuracy"] for b in pts], mode="lines+markers",
                name=NAMES.get(v, v), legendgroup=v, showlegend=i == 0, xaxis=f"x{k}", yaxis=f"y{k}",
                line=dict(color=COLORS.get(v), dash="solid" if v == "model" else "dash"),
                marker=dict(color=COLORS.get(v), size=[6 + 14 * (b["count"] / most) ** 0.5 for b in pts]),
                customdata=[[b["count"], b["lo"], b["hi"]] for b in pts],
                hovertemplate=(f"{NAMES.get(v, v)}, depth {depth}<br>bin %{{customdata[1]:.1f}}–%{{customdata[2]:.1f}}: "
                               "%{customdata[0]} drafts<br>confidence %{x:.3f}, right %{y:.3f}<extra></extra>")))
            if d["ece"] is not None:
                eces.append(f"{'adapter' if v == 'model' else 'bare'} {d['ece']:.3f}")
        notes.append(dict(text=f"depth {depth} (token +{depth + 1})<br>ECE " + ", ".join(eces) if eces else
                          f"depth {depth}", x=x0 + width / 2, y=1.0, xref="paper", yref="paper", yanchor="bottom",
                          showarrow=False, font=dict(size=12)))
    layout["annotations"] = notes + ([] if variants else [_HINT])
    return _figure(traces, "Does a draft's confidence mean what it says? (reliability per mask depth)", height=360,
                   margin=dict(l=55, r=15, t=85, b=90), **layout)


def make_depth_figure(result: dict | None) -> go.Figure:
    """Accuracy (solid) and mean confidence (dashed) of the drafts by mask depth, per variant."""
    traces = []
    for v, a in _variants(result):
        ds = [d for d in a["depths"] if d["count"]]
        x = [d["depth"] for d in ds]
        for key, dash, label in (("accuracy", "solid", "right"), ("confidence", "dash", "confidence")):
            traces.append(go.Scatter(
                x=x, y=[d[key] for d in ds], mode="lines+markers", name=f"{NAMES.get(v, v)}: {label}",
                line=dict(color=COLORS.get(v), dash=dash), marker=dict(color=COLORS.get(v), size=8),
                customdata=[d["count"] for d in ds],
                hovertemplate=f"{NAMES.get(v, v)}, depth %{{x}}: {label} %{{y:.3f}} (%{{customdata}} drafts)<extra></extra>"))
    layout = dict(xaxis=dict(title=dict(text="mask depth (drafts the token depth+1 places ahead)"), dtick=1),
                  yaxis=dict(title=dict(text="share / mean"), range=[0, 1.02]))
    if not traces:
        layout["annotations"] = [_HINT]
    return _figure(traces, "Accuracy and confidence by depth", height=320, **layout)


def make_tokens_per_pass_figure(result: dict | None) -> go.Figure:
    """Tokens per pass against tau: what the drafts predict (the decoder's rule on the teacher-forced drafts;
    dotted: the walk along each answer), and what decoding the same prompts measured, with the gap."""
    traces = []
    for v, a in _variants(result):
        rows = [t for t in a["tokens_per_pass"] if t["predicted"] is not None]
        traces.append(go.Scatter(
            x=[t["tau"] for t in rows], y=[t["predicted"] for t in rows], mode="lines", name=f"{NAMES.get(v, v)}: predicted",
            line=dict(color=COLORS.get(v), dash="solid" if v == "model" else "dash"),
            hovertemplate=f"{NAMES.get(v, v)}: τ %{{x:.2f}} predicts %{{y:.2f}} tokens/pass<extra></extra>"))
        if v == "model":
            traces.append(go.Scatter(
                x=[t["tau"] for t in rows], y=[t["walk"] for t in rows], mode="lines", name="with adapter: predicted (walk)",
                line=dict(color=COLORS.get(v), dash="dot", width=1),
                hovertemplate="walk along the answers: τ %{x:.2f}, %{y:.2f} tokens/pass<extra></extra>"))
    measured = (result or {}).get("measured") or []
    if measured:
        traces.append(go.Scatter(
            x=[m["tau"] for m in measured], y=[m["tokens_per_pass"] for m in measured], mode="markers+text",
            name="with adapter: measured (decoding)", marker=dict(color=MEASURED_COLOR, size=10, symbol="diamond"),
            text=[f"{m['gap']:+.2f}" if m.get("gap") is not None else "" for m in measured], textposition="top center",
            hovertemplate="decoded at τ %{x:.2f}: %{y:.2f} tokens/pass (gap to predicted %{text})<extra></extra>"))
    layout = dict(xaxis=dict(title=dict(text="τ"), range=[-0.02, 1.02]),
                  yaxis=dict(title=dict(text="tokens per pass"), rangemode="tozero"))
    if not traces:
        layout["annotations"] = [_HINT]
    return _figure(traces, "Tokens per pass: predicted by the drafts vs measured by decoding (labels: the gap)",
                   height=340, **layout)


def make_classes_figure(result: dict | None) -> go.Figure:
    """By the drafted token's class: share of drafts right (bars) and share at or above tau (markers)."""
    traces = []
    tau = ((result or {}).get("settings") or {}).get("tau")
    for v, a in _variants(result):
        cs = [c for c in a["classes"] if c["count"]]
        x = [c["class"] for c in cs]
        traces.append(go.Bar(x=x, y=[c["accuracy"] for c in cs], name=f"{NAMES.get(v, v)}: right",
                             marker=dict(color=COLORS.get(v)), offsetgroup=v, customdata=[c["count"] for c in cs],
                             hovertemplate=f"{NAMES.get(v, v)}, %{{x}}: %{{y:.3f}} right (%{{customdata}} drafts)<extra></extra>"))
        traces.append(go.Scatter(x=x, y=[c["accepted"] for c in cs], mode="markers", name=f"{NAMES.get(v, v)}: ≥ τ",
                                 marker=dict(color="#111111" if v == "model" else "#999999", symbol="line-ew-open",
                                             size=22, line=dict(width=3)),
                                 hovertemplate=f"{NAMES.get(v, v)}, %{{x}}: %{{y:.3f}} of drafts at or above τ<extra></extra>"))
    layout = dict(barmode="group", xaxis=dict(title=dict(text="class of the drafted token")),
                  yaxis=dict(title=dict(text="share of drafts"), range=[0, 1.02]))
    if not traces:
        layout["annotations"] = [_HINT]
    title = "Which tokens can be drafted ahead? (bars: right; bars' marks: confidence ≥ τ" + (
        f" = {tau:g})" if tau is not None else ")")
    return _figure(traces, title, height=340, **layout)


def render_table_html(result: dict | None, variant: str = "model", run: int | None = None) -> str:
    """The ten most confident wrong drafts and the ten right drafts just under tau, each in its context:
    the text before the pass, the pass's earlier tokens [in brackets], then the draft against the right token.
    run: the run's number in the visitor's session (mars.app.accept_inspect); given, each row gets an "inspect"
    button (id accept-inspect-<kind>-<i>) that carries the row's key, to open its pass in the Generate tab."""
    if not result or variant not in result.get("variants", {}):
        return '<div class="mars-note">The drafts most confidently wrong and right-but-under-τ appear here.</div>'
    a, tau = result["variants"][variant], result["settings"]["tau"]
    cols = 7 + (run is not None)

    def control(key, i):
        if run is None:
            return ""
        return (f'<td><button class="accept-inspect" id="accept-inspect-{key}-{i}" data-case="{case_key(run, key, i)}" '
                'title="open this pass in the Generate tab\'s inspector">inspect</button></td>')

    parts = []
    for key, title in (("confident_wrong", f"{NAMES.get(variant, variant)}: the most confident wrong drafts"),
                       ("right_under_tau", f"{NAMES.get(variant, variant)}: right drafts just under τ = {tau:g}")):
        rows = "".join(
            f'<tr data-kind="{key}"><td>{r["confidence"]:.3f}</td><td>{r["depth"]}</td>'
            f'<td class="mars-context">…{esc(r["before"])}<b>[{esc(r["pass"])}]</b></td>'
            f'<td><code>{esc(repr(r["draft"]))}</code></td><td><code>{esc(repr(r["right"]))}</code></td>'
            f'<td>{esc(r["class"])}</td><td title="{esc(r["prompt"])}">{r["prompt_index"] + 1}</td>'
            f'{control(key, i)}</tr>'
            for i, r in enumerate(a[key])) or f'<tr><td colspan="{cols}">none</td></tr>'
        head = "<th>pass</th>" if run is not None else ""
        parts.append(f'<p><b>{esc(title)}</b></p><table class="mars-inspect mars-accept-table" data-table="{key}">'
                     "<tr><th>confidence</th><th>depth</th><th>context … [the pass's earlier tokens]</th>"
                     f"<th>draft</th><th>right token</th><th>class</th><th>prompt</th>{head}</tr>{rows}</table>")
    return "".join(parts)


def render_summary_html(result: dict | None, progress: str = "") -> str:
    """One line per variant (drafts, share right, ECE) and the run's progress or timings."""
    if not result:
        return f'<div class="mars-note">{esc(progress)}</div>' if progress else ""
    lines = []
    for v, a in _variants(result):
        if a["accuracy"] is None:
            continue
        lines.append(f"<b>{esc(NAMES.get(v, v))}</b>: {a['drafts']} drafts, {a['accuracy']:.1%} right, "
                     f"mean confidence {a['confidence']:.3f}, ECE {a['ece']:.3f}")
    sec = result.get("seconds") or {}
    if sec:
        lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in sec.items()))
    if progress:
        lines.append(esc(progress))
    return '<div class="mars-note">' + "<br>".join(lines) + "</div>"
