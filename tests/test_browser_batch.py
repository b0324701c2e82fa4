"""The Batch tab in headless Chromium (Playwright): rows, groups, idle markers, escaping, the measured
comparison, downloads, and a bad input's message. Skips where Chromium or playwright is missing."""

from __future__ import annotations

import os

import pytest

from conftest import open_tab, save_screenshot, serve, set_number

PROMPTS = ["what is the capital of france ?", "tell me a word", '<img src=x onerror="window.__xss=1">']


@pytest.fixture(scope="module")
def url():
    import tiny

    lm = tiny.make_loaded()
    demo, url = serve(lambda: lm)
    yield url
    demo.close()


@pytest.fixture(scope="module")
def page(url, browser):
    page = open_tab(browser, url, "Batch", "#batch-prompts textarea")
    yield page
    page.close()


def test_batch_rows_groups_idle_comparison_and_downloads(page):
    page.fill("#batch-prompts textarea", "\n".join(PROMPTS))
    set_number(page, "batch-tau", 0.1)  # on the tiny model: rows accept different counts, so some idle
    set_number(page, "batch-cache-block", 4)
    set_number(page, "batch-max-new-tokens", 24)
    page.click("#batch-run")
    page.wait_for_selector("#batch-output .mars-batch[data-state=done]", timeout=120_000)
    assert page.locator("#batch-output .mars-row").count() == 3
    for i in range(3):
        groups = page.locator(f"#batch-output .mars-row[data-row='{i}'] .mars-group")
        assert groups.count() > 0
        for attr in ("data-pass", "data-size", "data-conf", "data-tau"):
            assert groups.first.get_attribute(attr) is not None
    assert page.locator("#batch-output .mars-idle").count() > 0
    assert page.locator("#batch-output img").count() == 0 and not page.evaluate("window.__xss === 1")
    assert PROMPTS[2] in page.locator("#batch-output .mars-row[data-row='2'] .mars-row-prompt").inner_text()
    page.wait_for_selector("#batch-compare [data-complete=true]", timeout=120_000)
    assert page.locator("#batch-compare-table tr").count() == 4
    assert page.locator("#batch-chart .js-plotly-plot").count() == 1
    assert page.locator("#batch-download-html").is_enabled() and page.locator("#batch-download-json").is_enabled()


def test_bad_batch_input_shows_a_message(page):
    page.fill("#batch-prompts textarea", "\n".join(["hi"] * 9))
    page.click("#batch-run")
    page.wait_for_selector("text=at most 8", timeout=30_000)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MARS_BROWSER_DEFAULT") != "1", reason="set MARS_BROWSER_DEFAULT=1 (default model)")
def test_default_model_batch_view_screenshot(browser):
    """The Batch tab on the default model and the shipped adapter, at the tab's defaults: writes
    assets/batch.png for the README and prints the measured comparison."""
    from mars.app.serving import default_provider

    demo, url = serve(default_provider())
    try:
        page = open_tab(browser, url, "Batch", "#batch-prompts textarea")
        page.click("#batch-run")
        page.wait_for_selector("#batch-compare [data-complete=true]", timeout=900_000)
        print("\n" + page.locator("#batch-compare-table").inner_text())
        assert page.locator("#batch-output .mars-row").count() == 4
        save_screenshot(page, "batch.png")
        page.close()
    finally:
        demo.close()
