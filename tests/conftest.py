"""Shared pytest set-up: the `slow` marker, thread count, the models tests share, and small helpers.

Imports: pytest.ini puts the repository root on the path (`app.py` is the Space's entry file, not part of
the package); `tiny` sits beside this file, which pytest's default import mode puts on the path.
"""

import importlib
import os
import sys
from pathlib import Path

import pytest

# The caller's Hub mode must not reach the tests (issue 55 item 6d): huggingface_hub (and transformers through it)
# reads HF_HUB_OFFLINE once, at import, and then refuses every request, the fake Hub's on 127.0.0.1 too. So the run
# starts online whatever the shell says, before `tiny` and `mars` import it; a test that wants offline sets the
# variable itself (`env`, monkeypatch), which mars.settings reads.
HUB_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
for _name in HUB_OFFLINE_VARS:
    os.environ.pop(_name, None)
if "huggingface_hub.constants" in sys.modules:  # imported before this file (by a plugin): its copy is already read
    sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = False

import tiny  # noqa: E402 - after the environment is settled
from mars.app.serving import free_port  # noqa: E402


ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs minutes of CPU; deselected by pytest.ini, run with -m slow")
    config.addinivalue_line("markers", "needs_c: needs the C kernels: skips where they are not expected (no C "
                                       "compiler, MARS_C_KERNELS=0), fails where a compiler exists and the build failed")


def pytest_runtest_setup(item):
    """The `needs_c` gate (lesson 15): a broken C build fails these tests with the compiler's message instead of
    turning them into skips."""
    if item.get_closest_marker("needs_c") is None:
        return
    from mars.runtime import kernels

    why = kernels.skip_reason()
    if why:
        pytest.skip(f"no C kernels here: {why}")
    if kernels.kernels() is None:
        pytest.fail(f"a C compiler is here but the kernels did not build: {kernels.unavailable_reason()}",
                    pytrace=False)


def pytest_sessionstart(session):
    import torch

    # Tiny models gain nothing from threads, and on a shared 2-core machine extra threads only contend.
    torch.set_num_threads(int(os.environ.get("MARS_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def fresh_settings():
    """Settings read from this test's environment (mars.settings), and again after it, so a variable one test
    sets never reaches the next. A test that sets a variable mid-test calls `settings.reload()` after it."""
    from mars import settings

    settings.get.cache_clear()
    yield
    settings.get.cache_clear()


@pytest.fixture
def env(monkeypatch):
    """Sets (`env.set(name, value)`) and unsets (`env.unset(name)`) environment variables for one test, as
    monkeypatch does, and has mars.settings read the environment again on its next `get()`: a bad value
    raises where the code under test reads it."""
    from mars import settings

    class Env:
        def set(self, name: str, value: str):
            monkeypatch.setenv(name, value)
            settings.get.cache_clear()

        def unset(self, name: str):
            monkeypatch.delenv(name, raising=False)
            settings.get.cache_clear()

    return Env()


@pytest.fixture(scope="session", autouse=True)
def run_files_in_tmp(tmp_path_factory):
    """The app writes each run's downloads under tempfile's folder: keep them in pytest's."""
    import tempfile

    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("runs"))
    yield
    tempfile.tempdir = old


@pytest.fixture(scope="session")
def tiny_lm():
    return tiny.make_loaded("llama")


@pytest.fixture(scope="session")
def tiny_qwen():
    return tiny.make_loaded("qwen2", seed=1)


@pytest.fixture(scope="session")
def default_lm():
    """The embedded default model, bare (no adapter): loaded once per test session."""
    from mars.models.loading import load

    return load(adapter="none")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tiny.save_tiny(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="module")
def lm():
    """The app tests' model: a fresh tiny one per module (app tests may patch it)."""
    return tiny.make_loaded()


@pytest.fixture(scope="module")
def ui(lm):
    """The app's logic around `lm`, without a server."""
    import app as app_module

    ui = app_module.create_demo(lambda: lm).mars_app
    ui.text_every_s = 0.0  # one update per pass, as the tests count them (the default sends ~10 a second)
    return ui


@pytest.fixture(scope="session")
def load_script():
    """Import one of tools/*.py or benchmarks/*.py by its name (both are packages at the repository root)."""

    def load(name: str):
        package = "tools" if (ROOT / "tools" / f"{name}.py").is_file() else "benchmarks"
        return importlib.import_module(f"{package}.{name}")

    return load


# Helpers for the tests that serve the app (imported as `from conftest import ...`)
CHROMIUM = "/usr/bin/chromium"  # Debian's; scripts/test.sh installs it where missing
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def serve(provider, load_first: bool = True):
    """The app around `provider` on a free loopback port, as `python app.py` serves it: (demo, url).
    load_first: load the model before serving (a timed test starts its clock with the model loaded)."""
    import app

    demo = app.create_demo(provider)
    if load_first:
        demo.mars_app.holder.get()
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through playwright; the test skips where either is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing (pip install playwright)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_tab(browser, url: str, tab: str, ready: str):
    """A new 1400x1000 page on the app at `url`, on the tab named `tab`, once the selector `ready` shows (the
    tab has drawn). The caller closes it."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_role("tab", name=tab).click()
    page.wait_for_selector(ready, timeout=60_000)
    return page


def set_number(page, elem_id: str, value):
    """Type a value into a Gradio number or slider box and commit it, as a visitor does."""
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def save_screenshot(page, name: str, budget: int = 300_000) -> Path:
    """A full-page screenshot into assets/<name>, kept sharp and under `budget` bytes (it is committed)."""
    shot = ROOT / "assets" / name
    page.screenshot(path=str(shot), full_page=True)
    shrink_png(shot, budget)
    assert shot.stat().st_size < budget
    return shot


def shrink_png(path: Path, budget: int = 300_000):
    """A full-page PNG of the app is ~1 MB; a 256-colour palette keeps it sharp and under budget."""
    from PIL import Image

    img = Image.open(path).convert("RGB")
    while True:
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
        if path.stat().st_size < budget or img.width < 700:
            return
        img = img.resize((int(img.width * 0.85), int(img.height * 0.85)), Image.LANCZOS)
