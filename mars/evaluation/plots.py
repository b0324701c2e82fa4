"""Static plots for reports (PNG via matplotlib, interactive HTML via plotly): pure data in, file out.

The app draws its own live charts in `mars.app.viz`; these are for README, model cards and closing notes.
"""

from __future__ import annotations

from pathlib import Path

from mars.decoding.records import stored
from mars.jsonl import read_jsonl


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # no screen here
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def bench_png(data: dict, path: str | Path) -> Path:
    """Tokens per forward and speed-up vs AR against tau, one line per batch size (the bench JSON)."""
    plt = _plt()
    runs = [r for r in data["runs"] if r["method"] == "mars"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for bs in sorted({r["batch_size"] for r in runs}):
        rs = sorted((r for r in runs if r["batch_size"] == bs), key=lambda r: r["tau"])
        taus = [r["tau"] for r in rs]
        axes[0].plot(taus, [stored(r, "tokens_per_pass") for r in rs], "o-", label=f"batch {bs}")
        axes[1].plot(taus, [r["speedup_vs_ar"] for r in rs], "o-", label=f"batch {bs}")
    # the tau-free methods (Jacobi, prompt lookup, verified, transformers) as flat reference lines
    others = [r for r in data["runs"] if r["method"] not in ("mars", "ar") and r["batch_size"] == 1]
    for k, r in enumerate(others):
        style = dict(color=f"C{k + 3}", ls=":", lw=1.2, label=f"{r['method']} (batch 1)")
        axes[0].axhline(stored(r, "tokens_per_pass"), **style)
        axes[1].axhline(r["speedup_vs_ar"], **style)
    axes[0].set(xlabel="tau", ylabel="tokens per forward", title="MARS: tokens per forward pass")
    axes[1].axhline(1.0, color="grey", lw=1, ls="--")
    axes[1].set(xlabel="tau", ylabel="wall-clock speed-up vs AR", title="MARS vs the core's AR mode")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{data.get('model')} + {Path(data.get('adapter') or 'no adapter').name}", fontsize=9)
    return _save(plt, fig, path)


def bench_html(data: dict, path: str | Path) -> Path:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = [r for r in data["runs"] if r["method"] == "mars"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per forward", "speed-up vs AR"))
    for bs in sorted({r["batch_size"] for r in runs}):
        rs = sorted((r for r in runs if r["batch_size"] == bs), key=lambda r: r["tau"])
        x = [r["tau"] for r in rs]
        fig.add_trace(go.Scatter(x=x, y=[stored(r, "tokens_per_pass") for r in rs], name=f"batch {bs}"), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=[r["speedup_vs_ar"] for r in rs], name=f"batch {bs} speed-up"), 1, 2)
    for r in (r for r in data["runs"] if r["method"] not in ("mars", "ar") and r["batch_size"] == 1):
        fig.add_hline(y=stored(r, "tokens_per_pass"), line_dash="dot", annotation_text=r["method"], row=1, col=1)
        fig.add_hline(y=r["speedup_vs_ar"], line_dash="dot", annotation_text=r["method"], row=1, col=2)
    fig.update_xaxes(title_text="tau")
    fig.write_html(str(path), include_plotlyjs="cdn")
    return Path(path)


def loss_png(log_path, path: str | Path, title: str = "") -> Path:
    """Noisy and clean loss against training minutes, from a trainer's log.jsonl, or from several (a list,
    oldest first: a checkpoint trained in pieces), chained end to end with a dotted line where a piece starts."""
    plt = _plt()
    logs = [log_path] if isinstance(log_path, (str, Path)) else list(log_path)
    minutes, noisy, clean, starts, offset = [], [], [], [], 0.0
    for log in logs:
        rows = read_jsonl(log)
        starts.append(offset)
        minutes += [offset + r["seconds"] / 60 for r in rows]
        noisy += [r["noisy"] for r in rows]
        clean += [r.get("clean", float("nan")) for r in rows]  # a gated adapter trains no clean loss
        offset = minutes[-1] if minutes else offset
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(minutes, noisy, label="noisy (mask) loss")
    if any(c == c for c in clean):  # not all NaN
        ax.plot(minutes, clean, label="clean (SFT) loss")
    for x in starts[1:]:
        ax.axvline(x, color="grey", ls=":", lw=1)
    ax.set(xlabel="training minutes" + (" (dotted: a new piece)" if len(logs) > 1 else ""), ylabel="cross-entropy",
           title=title or "MARS training")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def nll_cost(point: dict, tau: str) -> float | None:
    """A curve point's quality cost at tau: the text's NLL under the model in AR mode over its own AR (tau 1)
    text's; None where that decoding was not measured."""
    q = point.get("quality", {})
    if tau not in q or "1" not in q:
        return None
    return q[tau]["mean_nll_under_ar"] / q["1"]["mean_nll_under_ar"]


def curve_png(points: list[dict], path: str | Path) -> Path:
    """Acceptance against training CPU-hours: teacher-forced estimated tokens per pass and draft accuracy
    per distance, plus real tokens per forward at each tau where measured.

    points: [{"cpu_hours", "est_tokens_per_pass", "accuracy_by_distance": {"2": ..}, "tokens_per_pass": {"0.9": ..}} (older files: "tokens_per_forward")]
    A point with a "branch" (an arm that left the shipped chain: other recipe, not continued) is drawn as a
    lone marker named by its label, not joined to the chain's line.
    """
    plt = _plt()
    pts = sorted((p for p in points if not p.get("branch")), key=lambda p: p["cpu_hours"])
    branches = [p for p in points if p.get("branch")]
    x = [p["cpu_hours"] for p in pts]
    with_quality = [p for p in pts if "1" in p.get("quality", {})]
    fig, axes = plt.subplots(1, 3 if with_quality else 2, figsize=(13.5 if with_quality else 9, 3.6))
    axes[0].plot(x, [p["est_tokens_per_pass"] for p in pts], "o-", label="teacher-forced estimate")
    taus = sorted({t for p in pts for t in stored(p, "tokens_per_pass", {})}, reverse=True)
    colour = {t: f"C{i + 1}" for i, t in enumerate(taus)}  # one colour per tau in both panels that show taus
    for tau in taus:
        xs = [(p["cpu_hours"], stored(p, "tokens_per_pass")[tau]) for p in pts if tau in stored(p, "tokens_per_pass", {})]
        axes[0].plot([a for a, _ in xs], [b for _, b in xs], "s--", color=colour[tau], label=f"decoding, tau {tau}")
    axes[0].set(xlabel="training CPU-hours", ylabel="tokens per forward", title="acceptance against training time")
    for d in sorted({d for p in pts for d in p["accuracy_by_distance"]}, key=int):
        axes[1].plot(x, [p["accuracy_by_distance"].get(d) for p in pts], "o-", label=f"distance {d}")
    for i, p in enumerate(branches):
        axes[0].plot(p["cpu_hours"], p["est_tokens_per_pass"], "x", color="k", label="arms (not continued)" if i == 0 else None)
        axes[0].annotate(p["branch"], (p["cpu_hours"], p["est_tokens_per_pass"]), fontsize=7, xytext=(3, -8),
                         textcoords="offset points")
        for j, (d, a) in enumerate(sorted(p["accuracy_by_distance"].items(), key=lambda kv: int(kv[0]))):
            axes[1].plot(p["cpu_hours"], a, "x", color=f"C{j}")
    axes[1].set(xlabel="training CPU-hours", ylabel="draft accuracy (teacher-forced)", title="mask accuracy")
    if with_quality:  # the price of those tokens: the text's NLL under the model in AR mode, over its own AR text's
        for tau in sorted({t for p in with_quality for t in p["quality"] if t != "1"}, reverse=True):
            xs = [(p["cpu_hours"], nll_cost(p, tau)) for p in with_quality if tau in p["quality"]]
            axes[2].plot([a for a, _ in xs], [b for _, b in xs], "s--", color=colour.get(tau), label=f"tau {tau}")
        axes[2].axhline(1.15, color="grey", lw=0.8, ls=":", label="goal: within 15%")
        axes[2].set_yscale("log")  # tau 0.5 costs several times what tau 0.9 does
        ticks = [1, 1.15, 1.5, 2, 3, 5, 8]
        axes[2].set_yticks(ticks, [f"{t:g}x" for t in ticks])
        axes[2].yaxis.set_minor_formatter(plt.NullFormatter())
        axes[2].set(xlabel="training CPU-hours", ylabel="NLL under AR / own AR text's (log)", title="quality cost")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


JUDGES = {"ar": ("mean_nll_under_ar", "mean NLL of the text under the model in AR mode"),
          "bare": ("mean_nll_under_bare", "mean NLL of the text under the bare model")}


def pareto_points(report: dict, judge: str = "ar") -> list[tuple[float, float, float]]:
    """(tau, tokens per forward, NLL of the text) per decoding row, tau descending. judge "ar": under the
    model's own AR mode; "bare": under the bare model, one yardstick for checkpoints whose AR modes differ
    (an eval of the bare model itself has only its own AR NLL, which is that yardstick)."""
    key = JUDGES[judge][0]
    out = []
    for r in sorted(report["decoding"], key=lambda r: -r["tau"]):
        nll = r.get(key)
        if nll is None and judge == "bare" and report.get("adapter") in (None, "none"):
            nll = r.get("mean_nll_under_ar")
        if nll is not None:
            out.append((r["tau"], stored(r, "tokens_per_pass"), nll))
    return out


def pareto_png(evals: dict[str, dict], path: str | Path, judge: str = "ar") -> Path:
    """Tokens per forward against quality (the text's NLL, judged as `pareto_points` says), one curve per
    checkpoint: Fig. 3."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, report in evals.items():
        pts = pareto_points(report, judge)
        ax.plot([s for _, s, _ in pts], [q for _, _, q in pts], "o-", label=name)
        for tau, speed, nll in pts:
            ax.annotate(f"{tau:g}", (speed, nll), fontsize=7)
    ax.set(xlabel="tokens per forward pass", ylabel=JUDGES[judge][1], title="speed / quality trade-off (labels: tau)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def calibration_png(report: dict, path: str | Path) -> Path:
    """Mask confidence against how often the mask's argmax is the AR token (teacher-forced)."""
    plt = _plt()
    cal = report["draft_accuracy"]["calibration"]
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1)
    ax.scatter([c["confidence"] for c in cal], [c["accuracy"] for c in cal],
               s=[10 + 200 * c["count"] / max(1, max(x["count"] for x in cal)) for c in cal])
    ax.set(xlabel="mask confidence (max prob)", ylabel="accuracy vs AR token", xlim=(0, 1), ylim=(0, 1),
           title="draft calibration")
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)
