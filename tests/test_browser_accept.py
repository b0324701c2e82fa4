"""The Acceptance tab in headless Chromium (Playwright), on a tiny model with a gated adapter: the charts draw,
the tables fill (model text escaped), both downloads parse, a bad input gets its one message, Stop stops.
Skips where Chromium or playwright is missing.

`MARS_BROWSER_DEFAULT=1 pytest -m slow tests/test_browser_accept.py -s` runs the tab on the default model and
the shipped adapter (16 training-side prompts, 128 tokens, compare on), prints the measured seconds and
writes assets/accept.png for the README."""

from __future__ import annotations

import csv
import json
import os
import time

import pytest

from conftest import open_tab, save_screenshot, serve, set_number

PROMPTS = ["what is the capital of france ?", "add 2 + 3 = ?", '<img src=x onerror="window.__xss=1">']


@pytest.fixture(scope="module")
def gated_lm(tiny_dir, tmp_path_factory):
    from mars.models.loading import load
    from test_acceptance_lab import random_lora

    out = tmp_path_factory.mktemp("gated") / "adapter"
    random_lora(load(str(tiny_dir)).model).save_pretrained(out, safe_serialization=True)
    (out / "mars.json").write_text(json.dumps({"gated": True, "block_size": 4, "mask_token": "<|mask|>",
                                               "base_model": str(tiny_dir)}))
    return load(str(tiny_dir), adapter=str(out))


@pytest.fixture(scope="module")
def server(gated_lm):
    demo, url = serve(lambda: gated_lm)
    yield demo, url
    demo.close()


@pytest.fixture(scope="module")
def page(server, browser):
    page = open_tab(browser, server[1], "Acceptance", "#accept-prompts textarea")
    yield page
    page.close()


def plot_traces(page, elem_id: str) -> int:
    return page.evaluate(f"document.querySelector('#{elem_id} .js-plotly-plot').data.length")


def test_charts_draw_tables_fill_and_downloads_parse(page):
    page.fill("#accept-prompts textarea", "\n".join(PROMPTS))
    set_number(page, "accept-max-new-tokens", 16)
    set_number(page, "accept-tau", 0.2)
    page.fill("#accept-taus textarea", "0.5, 0.1")
    assert page.is_checked("#accept-compare input")
    page.click("#accept-run")
    page.wait_for_function("!document.querySelector('#accept-download-csv').disabled", timeout=120_000)
    for chart in ("accept-reliability", "accept-depth", "accept-tpp", "accept-classes"):
        assert plot_traces(page, chart) >= 2, chart  # the model's and the bare model's traces
    assert plot_traces(page, "accept-reliability") == 3 + 2 * 3  # per depth: the diagonal, the model, the bare model
    assert page.locator("#accept-table tr[data-kind=confident_wrong]").count() > 0
    assert page.locator("#accept-table img").count() == 0 and not page.evaluate("window.__xss === 1")
    assert "ECE" in page.locator("#accept-progress").inner_text()
    with page.expect_download() as got:
        page.click("#accept-download")
    data = json.loads(open(got.value.path()).read())
    assert set(data["variants"]) == {"model", "bare"} and [m["tau"] for m in data["measured"]] == [0.5, 0.1]
    assert [a["prompt"] for a in data["answers"]] == PROMPTS
    with page.expect_download() as got:
        page.click("#accept-download-csv")
    rows = list(csv.DictReader(open(got.value.path())))
    assert {r["variant"] for r in rows} == {"model", "bare"}


def test_a_rows_inspect_button_opens_its_pass_in_the_generate_tabs_inspector(page):
    """Issue 43 item 3: a row's inspect button switches to the Generate tab, whose inspector shows the row's pass
    with the row's draft marked, at the table's token and confidence (both teacher-forced at that position)."""
    page.reload()  # a fresh visitor: an empty table, the download off until this run is done
    page.get_by_role("tab", name="Acceptance").click()
    page.fill("#accept-prompts textarea", "\n".join(PROMPTS[1:]))  # the XSS prompt: shown as text there too
    set_number(page, "accept-max-new-tokens", 16)
    page.fill("#accept-taus textarea", "")
    page.click("#accept-run")
    page.wait_for_function("!document.querySelector('#accept-download-csv').disabled", timeout=120_000)
    row = page.locator("#accept-table tr[data-kind]:has(button.accept-inspect)").last  # right under tau, if any
    cells = row.locator("td")
    conf, depth, draft = float(cells.nth(0).inner_text()), cells.nth(1).inner_text(), cells.nth(3).inner_text()
    row.locator("button.accept-inspect").click()
    page.wait_for_selector("#inspect tr[data-case]", timeout=30_000)
    assert page.get_by_role("tab", name="Generate").get_attribute("aria-selected") == "true"
    assert page.locator("#inspect").is_visible() and not page.locator("#accept-table").is_visible()
    marked = page.locator("#inspect tr[data-case] td")
    assert marked.nth(0).inner_text() == f"mask +{depth}" and marked.nth(1).inner_text() == draft
    assert abs(float(marked.nth(2).inner_text()) - conf) < 0.0011  # the same number, each printed to 3 places
    assert "Acceptance lab, prompt" in page.inner_text("#inspect")
    assert page.locator("#inspect img").count() == 0 and not page.evaluate("window.__xss === 1")
    page.get_by_role("tab", name="Acceptance").click()  # where the module's other tests expect the page


def test_a_built_in_set_fills_the_prompts_and_bad_input_gets_one_message(page):
    page.locator("#accept-set input").click()
    page.get_by_role("option", name="math").click()
    page.wait_for_function("document.querySelector('#accept-prompts textarea').value.split('\\n').length == 16",
                           timeout=10_000)
    page.fill("#accept-prompts textarea", "\n".join(["hi"] * 17))
    page.click("#accept-run")
    page.wait_for_selector("text=the lab takes at most 16", timeout=30_000)


def test_stop_stops_within_a_forward(server, page):
    from test_browser import slow_backend

    demo, _ = server
    demo.mars_app.holder.backend = slow_backend(0.05)  # ~50 ms a forward, never ending on EOS: a long run
    try:
        page.reload()
        page.get_by_role("tab", name="Acceptance").click()
        page.fill("#accept-prompts textarea", "\n".join(PROMPTS * 5))
        set_number(page, "accept-max-new-tokens", 256)
        page.click("#accept-run")
        page.wait_for_selector("#accept-progress >> text=greedy answers", timeout=60_000)
        t0 = time.perf_counter()
        page.click("#accept-stop")
        page.wait_for_selector("#accept-progress >> text=stopped", timeout=10_000)
        took = time.perf_counter() - t0
        # one forward is ~50 ms, the rest the page's round trips on a shared machine; unstopped, the 256 passes
        # of the answers alone would take 13 s
        assert took < 8
        assert page.locator("#accept-download").is_disabled()
    finally:
        demo.mars_app.holder.backend = None


def test_a_new_run_stopped_before_its_drafts_leaves_none_of_the_last_runs_results(server, page):
    """The browser review: a run done, the prompts changed, Analyse then Stop within ~2 s: "stopped before the
    drafts were measured" under the previous prompts' charts, table (inspect buttons working) and downloads. A new
    run clears them at its start; stopped, the page shows no results and says why."""
    from test_browser import slow_backend

    demo, _ = server
    page.reload()
    page.get_by_role("tab", name="Acceptance").click()
    page.fill("#accept-prompts textarea", "\n".join(PROMPTS[:2]))
    set_number(page, "accept-max-new-tokens", 16)
    page.fill("#accept-taus textarea", "")
    page.click("#accept-run")
    page.wait_for_function("!document.querySelector('#accept-download-csv').disabled", timeout=120_000)
    assert page.locator("#accept-table button.accept-inspect").count() > 0 and plot_traces(page, "accept-depth") > 0
    demo.mars_app.holder.backend = slow_backend(0.05)  # ~50 ms a forward: the stop lands in the greedy answers
    try:
        page.fill("#accept-prompts textarea", "\n".join(["the sky is", "name a colour"] * 4))
        set_number(page, "accept-max-new-tokens", 128)
        page.click("#accept-run")
        page.wait_for_selector("#accept-progress >> text=greedy answers", timeout=60_000)
        page.click("#accept-stop")
        page.wait_for_selector("#accept-progress >> text=stopped before the drafts were measured", timeout=20_000)
        time.sleep(1.0)  # the event's end: Gradio applies its last update again
    finally:
        demo.mars_app.holder.backend = None
    assert "cleared" in page.inner_text("#accept-progress")
    assert page.locator("#accept-table button.accept-inspect").count() == 0
    assert page.locator("#accept-table tr[data-kind]").count() == 0
    assert page.locator("#accept-download").is_disabled() and page.locator("#accept-download-csv").is_disabled()
    for chart in ("accept-depth", "accept-tpp", "accept-classes"):
        assert plot_traces(page, chart) == 0, chart


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MARS_BROWSER_DEFAULT") != "1", reason="set MARS_BROWSER_DEFAULT=1 (default model)")
def test_default_model_acceptance_screenshot(browser):
    """The tab on the default model and the shipped adapter: 16 story prompts, 128 new tokens, compare on,
    the sweep's taus decoded; prints the seconds of each stage, writes assets/accept.png (and the data to
    MARS_ACCEPT_OUT when set)."""
    from mars.app.serving import default_provider

    demo, url = serve(default_provider())
    try:
        page = open_tab(browser, url, "Acceptance", "#accept-prompts textarea")
        page.locator("#accept-set input").click()
        page.get_by_role("option", name="stories").click()
        page.wait_for_function("document.querySelector('#accept-prompts textarea').value.split('\\n').length == 16")
        page.click("#accept-run")
        page.wait_for_function("!document.querySelector('#accept-download-csv').disabled", timeout=1_800_000)
        print("\n" + page.locator("#accept-progress").inner_text())
        with page.expect_download() as got:
            page.click("#accept-download")
        data = json.loads(open(got.value.path()).read())
        assert set(data["variants"]) == {"model", "bare"} and len(data["measured"]) == 3
        if os.environ.get("MARS_ACCEPT_OUT"):  # keep the data the README's paragraph quotes
            with open(os.environ["MARS_ACCEPT_OUT"], "w") as f:
                json.dump(data, f, indent=1)
        page.evaluate("window.scrollTo(0, 0)")
        save_screenshot(page, "accept.png")
        page.close()
    finally:
        demo.close()
