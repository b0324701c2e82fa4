"""The app's drawing functions: colouring, escaping, data attributes, and what each figure plots."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from mars.app import viz
from mars.decoding.records import PassRecord
from mars.decoding.masks import mars_attention_mask

XSS = ["<script>alert(1)</script>", '<img src=x onerror="alert(1)">']


def rec(i, text, ids, confs, rejected=(), tau=0.9, seconds=0.01, finish=None):
    return PassRecord(row=0, pass_index=i, token_ids=list(ids), text=text, confidences=list(confs),
                      rejected_token_ids=[0] * len(rejected), rejected_confidences=list(rejected), tau=tau,
                      seconds=seconds, cache_len=0, input_len=4, finish_reason=finish)


RECORDS = [
    rec(0, "def f(x):", [1], [0.5], [0.2, 0.1, 0.3]),
    rec(1, "\n    return", [2, 3], [0.8, 0.95], [0.4, 0.3]),
    rec(2, " x + 1", [4, 5, 6], [0.7, 0.93, 0.91], [0.2], tau=0.8),
    rec(3, "\n", [7, 8, 9, 10], [0.6, 0.99, 0.97, 0.92], [], tau=0.8),
    rec(4, "", [11], [0.9], [0.1, 0.1, 0.1], finish="eos"),
]


class Tags(HTMLParser):
    """Collects (tag, attrs) and the text, as a browser's parser would see them."""

    def __init__(self, html):
        super().__init__()
        self.tags, self.text = [], []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def groups(self):
        return [a for t, a in self.tags if "mars-group" in a.get("class", "").split()]


def test_one_group_per_pass_with_its_attributes():
    html = viz.render_groups_html(RECORDS)
    groups = Tags(html).groups()
    assert [g["data-pass"] for g in groups] == ["0", "1", "2", "3", "4"]
    assert [g["data-size"] for g in groups] == ["1", "2", "3", "4", "1"]
    assert groups[1]["data-conf"] == "0.800 0.950"
    assert [g["data-tau"] for g in groups] == ["0.900", "0.900", "0.800", "0.800", "0.900"]


def test_colours_alternate_and_deepen_with_group_size():
    groups = Tags(viz.render_groups_html(RECORDS)).groups()
    bg = [g["style"].split("background:")[1].split(";")[0] for g in groups]
    assert all(a != b for a, b in zip(bg, bg[1:]))  # consecutive passes never share a colour
    blue, orange = viz.SHADES["blue"], viz.SHADES["orange"]
    assert bg[0] == blue[0] and bg[1] == orange[1] and bg[2] == blue[2] and bg[3] == orange[3]
    assert viz.shade(0, 9) == viz.shade(0, 4)  # 4+ share the deepest shade
    assert viz.shade(0, 4)[1] == "#ffffff" and viz.shade(0, 1)[1] == "#111111"  # readable text on each shade


def test_text_is_preserved_exactly_in_a_pre_wrap_block():
    html = viz.render_groups_html(RECORDS[:4])
    parsed = Tags(html)
    assert "".join(parsed.text) == "def f(x):\n    return x + 1\n"
    assert parsed.tags[0][1]["class"].startswith("mars-text")
    assert "white-space: pre-wrap" in viz.GROUPS_CSS


def test_hover_names_pass_tokens_and_confidences():
    texts = [["a"], ["\n", "    return"], ["x", "+", "1"], ["1", "2", "3", "4"], [""]]
    title = Tags(viz.render_groups_html(RECORDS, texts)).groups()[1]["title"]
    assert title.startswith("pass 1 · 2 tokens · tau 0.90")
    assert "'\\n'  0.800" in title and "'    return'  0.950" in title


@pytest.mark.parametrize("payload", XSS)
def test_model_and_user_text_is_escaped(payload):
    records = [rec(0, payload, [1], [0.5])]
    html = viz.render_groups_html(records, [[payload]], placeholder=payload)
    tags = {t for t, _ in Tags(html).tags}
    assert tags == {"div", "span"}  # no script or img element was created
    assert "".join(Tags(html).text) == payload
    page = viz.standalone_html(records, [[payload]], payload, payload, payload)
    assert "<script>" not in page.replace("<script>alert", "") and "<img" not in page
    row = {"position": payload, "token": payload, "confidence": 0.5, "status": "accepted",
           "candidates": [(payload, 0.5)]}
    inspector = viz.render_inspector_html([row], payload, payload)
    assert not {t for t, _ in Tags(inspector).tags} & {"script", "img"}
    assert not {t for t, _ in Tags(viz.render_table_html([payload], [[payload]])).tags} & {"script", "img"}


def test_end_of_text_group_is_visible():
    groups = Tags(viz.render_groups_html(RECORDS)).groups()
    assert groups[-1]["data-size"] == "1"
    assert "∎" in viz.render_groups_html(RECORDS[-1:])


def test_legend_shows_both_families_and_four_shades():
    html = viz.render_legend_html()
    for fam in viz.FAMILIES:
        for colour in viz.SHADES[fam]:
            assert colour in html


def test_stats_tiles():
    html = viz.render_stats_html({"passes": 10, "tokens": 25, "tokens_per_pass": 2.5, "tokens_per_second": 50.0,
                                  "elapsed": 0.5, "speedup": None, "state": "running", "tau": 0.7})
    attrs = Tags(html).tags[0][1]
    assert attrs["data-state"] == "running" and attrs["data-tau"] == "0.700" and attrs["data-passes"] == "10"
    assert "2.50" in html and "—" in html
    assert "1.80×" in viz.render_stats_html({"speedup": 1.8})


def test_race_tiles_say_what_the_rate_divides_by_so_the_arithmetic_checks():
    """The browser review: "115 tokens", "elapsed 3.74 s" and "61.0 tokens / s" side by side, the rate over
    MARS's own 1.88 s of passes, not the race's wall clock. The rate's tile names the seconds it divides by, and
    the tokens, those seconds and the rate shown agree to their rounding; the elapsed tile says AR ran between."""
    import re

    from mars.decoding.decoder import DecodeConfig
    from mars.decoding.records import RunRecord

    mars = RunRecord(DecodeConfig(), [1]).add([rec(i, "x", [i] * 3, [0.9] * 3, seconds=0.0401) for i in range(38)])
    mars.add(rec(38, "y", [1], [0.9], seconds=0.0401))  # 115 tokens in 1.56 s of passes
    ar = RunRecord(DecodeConfig(mode="ar", block_size=1), [1]).add([rec(i, "x", [i], [1.0]) for i in range(60)])
    mars.started -= 3.0  # its wall clock: its passes, AR's between them and the waits
    mars.finish(), ar.finish()
    text = " ".join(Tags(viz.render_stats_html(viz.live_stats(mars, ar, "done", 0.9))).text)
    tokens = int(re.search(r"(\d+) tokens ", text).group(1))
    rate, secs = re.search(r"([\d.]+) tokens / s \(MARS's ([\d.]+) s of decoding\)", text).groups()
    assert tokens == 115 and float(secs) == pytest.approx(1.56, abs=0.005)
    assert tokens / float(secs) == pytest.approx(float(rate), abs=0.05 + tokens * 0.005 / float(secs) ** 2)
    elapsed = float(re.search(r"([\d.]+) s elapsed \(wall clock: AR's race passes too\)", text).group(1))
    assert elapsed >= 3.0 > float(secs)
    alone = " ".join(Tags(viz.render_stats_html(viz.live_stats(None, ar, "done", 1.0))).text)
    assert "60 tokens " in alone and "tokens / s (AR's 0.6 s of decoding)" in alone
    assert "elapsed (wall clock)" in alone
    fast = RunRecord(DecodeConfig(), [1]).add(rec(0, "x", [1, 2], [0.9, 0.9], seconds=0.0042))
    assert "(MARS's 0.0042 s of decoding)" in " ".join(Tags(viz.render_stats_html(
        viz.live_stats(fast, None, "running", 0.9))).text)  # not "0.00 s": enough digits to divide by


def test_standalone_page_is_complete():
    page = viz.standalone_html(RECORDS, None, "title", "prompt", "summary")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>")
    assert page.count('class="mars-group"') == len(RECORDS) and ".mars-group" in page


def test_tokens_per_pass_figure():
    from mars.decoding.decoder import DecodeConfig
    from mars.decoding.records import RunRecord

    fig = viz.make_tokens_per_pass_figure(RunRecord(DecodeConfig(), [1]).add(RECORDS), 4)
    bar, ar = fig.data
    assert bar.type == "bar" and list(bar.y) == [1, 2, 3, 4, 1]
    assert ar.name.startswith("AR") and list(ar.y) == [1, 1]
    assert "mean 2.20" in fig.layout.title.text
    assert "B = 4" in fig.layout.title.text


def no_run_note(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.text.startswith("no ")]


def test_empty_charts_have_plain_axes_a_note_and_no_b():
    """Before the first run and after Clear: the reviewer read "B = 4" over a page set to B 2, and axes from -1 to 1
    (-0.4 to 0.4 under the bars) around nothing."""
    tokens = viz.make_tokens_per_pass_figure(None, 4)
    assert "B =" not in tokens.layout.title.text and "mean" not in tokens.layout.title.text
    assert list(tokens.layout.xaxis.range) == [0, viz.EMPTY_PASSES] and tokens.layout.yaxis.range[0] == 0
    conf, race = viz.make_confidence_figure([]), viz.make_race_figure([])
    assert list(conf.layout.xaxis.range) == [0, viz.EMPTY_PASSES]
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
        low, high = race.layout[axis].range
        assert low == 0 and high >= 1, axis
    sweep = viz.make_sweep_figure([])
    assert list(sweep.layout.xaxis.range) == list(sweep.layout.xaxis2.range) == [0, 4]
    for fig in (tokens, conf, race, sweep):
        assert len(no_run_note(fig)) == 1, fig.layout.title.text
    # a chart with a run has no note and plotly's own ranges
    ar = [rec(i, "x", [i], [0.5]) for i in range(3)]
    for fig in (viz.make_race_figure(RECORDS, ar), viz.make_confidence_figure(RECORDS),
                viz.make_sweep_figure([{"tau": 1.0, "tokens_per_pass": 1.0, "agreement": 1.0, "nll": 1.2}])):
        assert not no_run_note(fig) and fig.layout.xaxis.range is None


def test_tokens_per_pass_axis_holds_passes_longer_than_b():
    """A verified run's draft tree (or n-gram copy) can accept more tokens in a pass than B (the browser review: a
    run at B 2 with passes of 3-5 tokens, mean 2.61, drew every bar cut off at 2.5). The axis holds the tallest
    bar; a run within B keeps the 0..B+0.5 axis."""
    from mars.decoding.decoder import DecodeConfig
    from mars.decoding.records import RunRecord

    long = RunRecord(DecodeConfig(mode="verified", block_size=2), [1]).add(RECORDS)  # passes of 1 to 4 tokens
    top = viz.make_tokens_per_pass_figure(long, 2).layout.yaxis.range[1]
    assert top >= max(len(r.token_ids) for r in RECORDS) + 0.5
    assert viz.make_tokens_per_pass_figure(long, 8).layout.yaxis.range[1] == 8.5


def test_confidence_figure_separates_ar_accepted_rejected_and_draws_tau():
    fig = viz.make_confidence_figure(RECORDS)
    by_name = {t.name: t for t in fig.data}
    assert len(by_name["AR token"].y) == 5  # one per pass, always accepted
    assert sorted(by_name["accepted mask"].y) == sorted([0.95, 0.93, 0.91, 0.99, 0.97, 0.92])
    assert len(by_name["rejected mask"].y) == 3 + 2 + 1 + 0 + 3
    assert list(by_name["tau"].y) == [0.9, 0.9, 0.8, 0.8, 0.9]


def test_race_figure_is_cumulative_for_both_runs():
    ar = [rec(i, "x", [i], [0.5], seconds=0.02) for i in range(11)]
    fig = viz.make_race_figure(RECORDS, ar)
    names = [(t.name, t.xaxis or "x") for t in fig.data]
    assert names == [("MARS", "x"), ("MARS", "x2"), ("AR", "x"), ("AR", "x2")]
    assert list(fig.data[0].y) == [0, 1, 3, 6, 10, 11] and list(fig.data[0].x) == [0, 1, 2, 3, 4, 5]
    assert fig.data[1].x[-1] == pytest.approx(0.05) and fig.data[3].x[-1] == pytest.approx(0.22)
    reference = viz.make_race_figure(RECORDS).data[-1]  # before the AR run: AR's known 1 token per pass
    assert reference.line.dash == "dash" and list(reference.y) == [0, 11]


def test_mask_heatmap_draws_the_training_mask():
    fig = viz.make_mask_heatmap(6, 2)
    heat = fig.data[0]
    assert [list(r) for r in heat.z] == mars_attention_mask(6, 2).int().tolist()
    assert list(heat.x[:2]) == ["c0", "c1"] and heat.x[6] == "n0" and len(heat.x) == 12
    assert "attends" in heat.text[0][0] and "blocked" in heat.text[0][1]
    dotted = [sh for sh in fig.layout.shapes if sh.line.dash == "dot"]
    assert sorted({sh.x0 for sh in dotted if sh.x0 == sh.x1}) == [1.5, 3.5, 7.5, 9.5]  # block edges, both copies


def test_sweep_figure_plots_quality_against_tokens_per_pass():
    rows = [{"tau": 1.0, "tokens_per_pass": 1.0, "agreement": 1.0, "nll": 1.2},
            {"tau": 0.5, "tokens_per_pass": 2.1, "agreement": 0.4, "nll": 1.9}]
    fig = viz.make_sweep_figure(rows)
    assert list(fig.data[0].x) == [1.0, 2.1] and list(fig.data[0].y) == [1.0, 0.4]
    assert list(fig.data[1].y) == [1.2, 1.9] and fig.data[1].yaxis == "y2"
    assert list(fig.data[0].text) == ["τ=1", "τ=0.5"]
    same = rows + [{"tau": 0.9, "tokens_per_pass": 1.0, "agreement": 1.0, "nll": 1.2}]
    assert list(viz.make_sweep_figure(same).data[0].text) == ["τ=1, 0.9", "τ=0.5", ""]  # no overprinting
    assert viz.make_sweep_figure([]).data[0].x in (None, ())



def test_sweep_figure_names_a_tau_swept_twice_once():
    row = {"tau": 0.9, "tokens_per_pass": 2.0, "agreement": 0.8, "nll": 1.5}
    # the same result twice, and a second run that drafted a little differently (its point lands close by)
    for again in (dict(row), dict(row, tokens_per_pass=2.05, agreement=0.78)):
        fig = viz.make_sweep_figure([row, again, dict(row, tau=0.5, tokens_per_pass=3.0)])
        for trace in fig.data:
            assert list(trace.text) == ["τ=0.9", "", "τ=0.5"]
            assert list(trace.customdata) == [0.9, 0.9, 0.5] and "customdata" in trace.hovertemplate  # hover: its tau


def test_sweep_figure_names_its_b_and_puts_neighbouring_labels_above_and_below():
    rows = [{"tau": t, "tokens_per_pass": 1.0 + i / 20, "agreement": 1.0, "nll": 1.0} for i, t in
            enumerate([1.0, 0.9, 0.8, 0.7])]
    fig = viz.make_sweep_figure(rows, 2)
    assert "B = 2" in fig.layout.title.text
    assert list(fig.data[0].textposition) == ["top center", "bottom center", "top center", "bottom center"]
    same = [rows[0], dict(rows[0], tau=0.95), rows[1]]  # the second shares the first's label: no turn is spent on it
    positions = viz.make_sweep_figure(same, 2).data[0].textposition
    assert positions[0] == "top center" and positions[2] == "bottom center"


def verified(i, text, ids, rejected_ids, rejected_confs, sent):
    r = rec(i, text, ids, [0.9] * len(ids), rejected_confs)
    r.rejected_token_ids, r.drafts_sent = list(rejected_ids), sent
    return r


@pytest.mark.parametrize("payload", XSS)
def test_verified_rejected_drafts_are_struck_through_escaped_and_not_text(payload):
    records = [verified(0, "The", [1], [], [], 0), verified(1, " cat sat", [2, 3], [7, 8], [0.6, 0.4], 3)]
    rejected = [[], [payload, "\nend"]]
    html = viz.render_groups_html(records, [["The"], [" cat", " sat"]], rejected_texts=rejected)
    parsed = Tags(html)
    struck = [a for t, a in parsed.tags if t == "s"]
    assert len(struck) == 1 and struck[0]["class"] == "mars-rejected" and struck[0]["data-pass"] == "1"
    assert struck[0]["data-draft"] == payload + "↵end"  # present (newlines made visible), as an attribute
    assert "'\\nend' 0.400" in struck[0]["title"]
    assert {t for t, _ in parsed.tags} == {"div", "span", "s"}  # the payload created no element
    assert "".join(parsed.text) == "The cat sat"  # the text (what copying gives) is the answer alone
    assert "s.mars-rejected::before { content: attr(data-draft); }" in viz.GROUPS_CSS
    assert "user-select: none" in viz.GROUPS_CSS
    assert Tags(html).groups()[1]["title"].splitlines()[1] == "1 of 3 drafts verified"
    page = viz.standalone_html(records, None, "t", "p", "s", rejected)
    assert 'class="mars-rejected"' in page and "<script>alert" not in page and "<img" not in page
    # MARS mode passes no rejected texts: its rejected proposals are not drafts that were checked
    assert "<s " not in viz.render_groups_html(records, None)


def test_a_draft_of_special_tokens_alone_is_not_struck_through():
    # the app gives a special token an empty piece (mars.app.session.run_stream): nothing of it is drawn
    records = [verified(0, "The", [1], [7, 8], [0.6, 0.4], 2), verified(1, " cat", [2], [9], [0.5], 1)]
    html = viz.render_groups_html(records, [["The"], [" cat"]], rejected_texts=[[" dog", ""], [""]])
    struck = [a for t, a in Tags(html).tags if t == "s"]
    assert len(struck) == 1 and struck[0]["data-draft"] == " dog"
    assert struck[0]["title"] == "rejected by the model: ' dog' 0.600"  # no '' for the special token


@pytest.mark.parametrize("payload", XSS)
def test_tree_view_marks_the_path_that_won_at_each_depth_and_escapes(payload):
    r = rec(5, "a b", [10, 20, 7], [0.9, 0.8, 0.7])
    r.tree_depths, r.tree_path, r.drafts_sent = [[11, 10, 12], [20, 21], [30]], [10, 20], 6
    names = {10: "a", 11: payload, 12: "c", 20: "b", 21: "d", 30: "e", 7: "own"}
    rows = viz.tree_rows(r, names.get)
    assert [row["winner"] for row in rows] == ["a", "b", None]
    assert [won for _, won in rows[0]["candidates"]] == [False, True, False]
    html = viz.render_tree_html(rows, "own", r.drafts_sent)
    tags = Tags(html)
    assert [a.get("data-won") for t, a in tags.tags if t == "span" and a.get("data-won")] == ["1", "1"]
    assert payload not in html and "<script>" not in html.replace(viz.esc(payload), "")
    assert "'a' → 'b' → then the model's own 'own'" in "".join(tags.text)
    assert "depth 3 no candidate under the accepted path" in viz.chain_stop_reason(r, 4, "verified")
    r.tree_path = [10, 20, 30]
    assert "deepest candidate" in viz.chain_stop_reason(r, 4, "verified")
    assert 'data-depths="0"' in viz.render_tree_html([], "x", 0)


def test_inspector_says_when_the_repeat_guard_stopped_the_chain():
    guarded = rec(5, " Europe", [7, 8], [0.9, 0.97], [0.95, 0.4])
    guarded.repeat_guard = True
    reason = viz.chain_stop_reason(guarded, 4)
    assert reason.startswith("repeat guard") and "position 2" in reason and "0.950" in reason
    rows = viz.inspector_rows(guarded, str)
    assert [r["status"] for r in rows] == ["accepted", "accepted", "rejected by the repeat guard: chain stops here",
                                           "dropped (after the stop)"]
    assert "repeat guard" in viz.render_inspector_html(rows, reason)
    plain = rec(5, " Europe", [7, 8], [0.9, 0.97], [0.5, 0.4])  # same pass, stopped by tau: no guard in the words
    assert "repeat" not in viz.chain_stop_reason(plain, 4) and "below tau" in viz.chain_stop_reason(plain, 4)
    assert "repeat" not in viz.inspector_rows(plain, str)[2]["status"]


def test_counts_of_one_are_singular_in_every_text():
    from mars.decoding.decoder import DecodeConfig
    from mars.decoding.records import RunRecord

    one = RunRecord(DecodeConfig(), [1]).add([rec(0, "", [11], [0.9], finish="eos")]).finish()
    line = viz.summary_line(one, one)
    assert "1 token in 1 forward pass " in line and "AR: 1 token in 1 pass," in line, line
    assert "1 tokens" not in line and "1 passes" not in line
    assert "2 tokens in 2 forward passes" in viz.summary_line(RunRecord(DecodeConfig(), [1]).add(RECORDS[:1] * 2))
    assert "pass 0 · 1 token · tau" in viz.render_groups_html(RECORDS[:1], [["def"]])
    assert [viz.plural(n, w) for n, w in [(1, "token"), (0, "token"), (2, "pass"), (1, "pass"),
                                            (3, "forward pass")]] == ["1 token", "0 tokens", "2 passes", "1 pass",
                                                                      "3 forward passes"]
