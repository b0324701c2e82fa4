"""The room on the page: the server's shared passes as a live line (issue 53, item 6: the paper's Figure 4 with
real visitors) and a run's note on whom its passes were shared with (item 5). Pure functions of data
(mars.app.batching.BatchServer.snapshot, a run's records); no visitor's text ever reaches them."""

from __future__ import annotations

import statistics
from html import escape as esc

from mars.app.viz import plural


def render_server_line(snap: dict | None) -> str:
    """One line: rows in the last shared pass and their widths, the pass's time, the aggregate tokens/s, who waits.
    snap None: the server runs one pass of one row at a time (MARS_BATCHING=0)."""
    if snap is None:
        body = "one pass of one row at a time (MARS_BATCHING=0): visitors take turns pass by pass"
    elif not snap["passes"]:
        body = f"continuous batching: every waiting row in one forward pass, up to {snap['cap']} rows; no pass yet"
    else:
        widths = snap["last_widths"]
        shown = " ".join(str(w) for w in widths[:24]) + (" …" if len(widths) > 24 else "")
        waiting = f"; {plural(snap['waiting'], 'row')} waiting for a place" if snap["waiting"] else ""
        body = (f"last pass: <b>{plural(snap['last_rows'], 'row')}</b> (inputs each: {esc(shown)}), "
                f"{snap['last_ms']:.1f} ms; <b>{snap['tokens_per_s']:.0f} tokens/s</b> in all over the last 10 s; "
                f"{plural(snap['running'], 'row')} running of at most {snap['cap']}{waiting}")
    return f'<div class="mars-note" id="server-room" data-rows="{(snap or {}).get("last_rows", 1)}">Server: {body}</div>'


def shared_note(*runs) -> str:
    """How a run's passes were shared: '' when every pass ran its rows alone, else the most and the median rows a
    pass (its own rows included: a race's MARS and AR rows share their passes, so the race compares like with
    like)."""
    rows = [rec.batch_rows for run in runs if run is not None for rec in run.steps]
    if not rows or max(rows) <= 1:
        return ""
    return (f"passes shared with other rows: up to {max(rows)} rows a pass (median {statistics.median(rows):g}); "
            "the race's two rows shared every pass they both ran")
