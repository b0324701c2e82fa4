"""What a visitor or an API client can send, made into a run: the prompt's checks, and the server's caps.

Values arrive from sliders, JSON clients and raw HTTP, so any type can show up. A run's settings are checked
by DecodeConfig and the checkers beside it (mars.decoding.decoder), so the app gives the core's messages; this module
adds only the server's lower caps (MAX_BLOCK, MARS_MAX_NEW_TOKENS, MARS_MAX_PROMPT_TOKENS), with those checkers.
"""

from __future__ import annotations

import logging

from mars import settings
from mars.decoding.decoder import DEFAULT_CACHE_BLOCK, DecodeConfig, check_choice, check_context, check_int, encode_prompt

MAX_BLOCK = 16  # the block-size slider's cap on this server, below the library's MAX_BLOCK_SIZE (CPU time)
MAX_TREE_NODES_APP = 64  # the tree-nodes slider's cap on this server, below the library's MAX_TREE_NODES (CPU time)
TOP_K = 5  # candidates kept per proposal, for the pass inspector
MODE_LABELS = {"MARS (tau rule)": "mars", "Verified (lossless)": "verified"}  # the app's modes: UI label -> core
APP_MODES = tuple(MODE_LABELS.values())
# The page opens in verified mode (issue 24), at B 2 with a tree of up to 4 nodes and one mask group: chosen
# again by measurement after the int8 one-row kernels (issue 41, `python -m benchmarks.app_defaults`, 20
# held-out prompts x 96 tokens, the app's own config path with its measured pass costs; docs/results.md):
# B 2 / tree 4 1.04-1.10x int8 AR in three runs, the other trees 0.96-1.14x (within the runs' noise, none
# ahead in every run), the chain 0.84-0.87x, MARS tau 0.9 0.83-0.89x at B 2 and 0.58-0.68x at B 4.
# Each mode's tau when the page opens or the mode is switched to it: verified sends every draft (tau 0, its
# fastest: tau never changes its text), MARS the paper's 0.9.
DEFAULT_MODE_LABEL = "Verified (lossless)"
MODE_TAU = {"mars": 0.9, "verified": 0.0}
TAU_LABELS = {"mars": "τ (live: moves the running generation)", "verified": "τ (verified: only which drafts get checked)"}
# Verified mode's block size on a CPU: one mask, so one draft a pass (or a longer copy from n-gram lookup).
# On two cores every input makes a pass dearer (a 7-input int8 pass ~1.3x a 1-input one), and the second and
# third mask drafts are rarely accepted. Measured at 46f9f71 (int8, 20 held-out prompts, 48 tokens, two
# interleaved rounds; README "Results"): against int8 AR, B 2 1.17x at 1.35 tokens per pass and 4.6 inputs,
# B 3 1.12x, B 4 1.07x at 1.45 tokens per pass and 7.4 inputs. A GPU, where a pass of 1 or 8 inputs costs the
# same, keeps the trained B. MARS mode always starts at the trained B: its chain of accepted masks is what the
# page teaches.
VERIFIED_CPU_BLOCK = 2


def mode_block(mode: str, lm=None) -> int:
    """The block size the page's slider takes for a mode (page load, mode switch, model switch): the model's
    trained B (the library's default without a model), but at most VERIFIED_CPU_BLOCK for verified mode on a
    CPU. The API's block_size defaults are fixed in its signature and do not follow this."""
    from mars.decoding.decoder import DEFAULT_BLOCK_SIZE

    trained = lm.default_block_size if lm is not None else DEFAULT_BLOCK_SIZE
    on_cpu = lm is None or str(getattr(lm.model, "device", "cpu")).startswith("cpu")
    if mode == "verified" and on_cpu:
        return min(trained, VERIFIED_CPU_BLOCK)
    return trained


def app_datastore(lm) -> bool:
    """Whether a tree also drafts from the datastore (mars.decoding.datastore): for the default model, whose
    own answers the table holds, unless MARS_DATASTORE=0 or its files cannot be read. The first call reads the
    table (~4 s) and hands it to the decoder on `lm.datastore`: the server's warm-up makes it."""
    from mars.models.datastore import shipped_store
    from mars.models.loading import DEFAULT_MODEL

    if lm.name != DEFAULT_MODEL or not settings.get().datastore:
        return False
    if lm.datastore is None:
        lm.datastore = shipped_store()  # missing or corrupt files: None, with one warning
    return lm.datastore is not None


def app_pass_costs(lm, backend: str):
    """This machine's pass costs (mars.decoding.costs.PassCosts) for `lm` on `backend`, measured once (~0.8 s, on the
    caller's thread: the app's model thread) and kept on the model; None where the app sends no tree (a GPU, a
    model without a mask token) or MARS_TREE_CUT=0 (every tree sends its N nodes and its mask group)."""
    if not settings.get().tree_cut or lm.mask_token_id is None or not app_tree_nodes() \
            or not isinstance(getattr(lm, "pass_costs", None), dict):
        return None
    if backend not in lm.pass_costs:
        from mars.decoding.costs import measure_pass_costs

        try:
            lm.pass_costs[backend] = measure_pass_costs(lm, backend)
        except Exception:  # noqa: BLE001 - a speed setting: without it trees send all N nodes, the app serves on
            logging.getLogger("mars.app").exception("could not measure the pass costs: trees send all their nodes")
            return None
    return lm.pass_costs[backend]


def app_cut_costs(lm, backend: str | None = None):
    """The table that cuts a tree on `backend` (mars.decoding.costs.PassCosts; default: the backend every visitor's
    runs resolve to), or None: every tree then sends its N nodes and its mask group. MARS_TREE_CUT=0 is asked
    here, where every run's config is fitted, and not only where the table is measured (app_pass_costs): a table
    already on the model (measured while the setting was on, or set by a caller) must not cut a tree the
    setting says is whole."""
    if not settings.get().tree_cut:
        return None
    if backend is None:
        backend = app_run_backend(lm)
    return getattr(lm, "pass_costs", {}).get(backend)


def app_tree_nodes() -> int:
    """The tree-nodes slider's starting value. On a CPU (MARS_DEVICE resolved): the CPU's tree,
    mars.decoding.tree.DEFAULT_TREE_NODES["cpu"] (4 nodes, with DecodeConfig.tree_groups' one mask group: 1.10-1.13x
    int8 AR against the chain's 1.06x on 10 held-out prompts, docs/tree.md). On a GPU 0, the chain: trees are
    not measured there yet. The API's verified endpoint keeps the chain."""
    from mars.decoding.tree import DEFAULT_TREE_NODES
    from mars.models.device import DeviceError, env_device

    try:
        return DEFAULT_TREE_NODES["cpu"] if env_device() == "cpu" else 0
    except DeviceError:  # MARS_DEVICE=cuda without a GPU: the model load says so; the page still builds
        return 0


def max_new_tokens_limit() -> int:
    return settings.get().max_new_tokens


def chart_every_s() -> float:
    """Seconds between chart redraws while a run streams (MARS_CHART_EVERY_S, default 3; 0 = every pass, inf =
    only at the end): each redraw is three plotly figures serialised by the server and drawn by the browser,
    work that falls during the next passes. At 1 s, five 128-token races on 2 cores took ~20% longer than at
    3 s, where a typical run (1.5-2.5 s here) gets its charts once, at the end (tools/race.py --chart-every
    1.0 3.0, docs/int8.md); a long run still sees them grow."""
    return settings.get().chart_every_s


def text_every_s() -> float:
    """Seconds between updates of the text and the stats while a run streams (MARS_TEXT_EVERY_S, default 0.1;
    0 = after every pass): the first pass and the last are sent at once, and each update holds every pass's
    group so far, each coloured as its own. A pass takes 6-15 ms on two cores, and every update costs the
    server and the browser time of their own. Measured with a headless Chromium on the server's two cores
    (tools/race.py): drawing every pass took ~60% of a core and MARS passes ran at 26-29 ms (10 ms alone);
    every 0.05 s 20-30 ms, every 0.1 s 15-16 ms. 10 updates a second still read as a stream."""
    return settings.get().text_every_s


def app_backend() -> str:
    """What runs the model for every visitor: MARS_BACKEND when set (any of mars.runtime.backends.BACKENDS), else
    "auto-int8": int8 matrices where the fast path runs on a CPU (issue 24: a quarter of float32's bytes per
    pass, its greedy text's NLL within 3% of float32's on the held-out prompts), transformers elsewhere. The
    lossless modes then give exactly the int8 model's greedy text; MARS_BACKEND=auto keeps float32."""
    return settings.get().backend


def app_run_backend(lm) -> str:
    """The backend every visitor's runs on `lm` resolve to (app_backend's "auto" names made concrete): the key of
    the model's pass-cost tables and what the Model panel names."""
    from mars.runtime.backends import resolve_backend

    return resolve_backend(lm.model, app_backend())


BACKEND_LABELS = {  # the Model panel's words for what runs the model
    "fast-int8": "int8 matrices (fast path): the lossless modes give exactly this int8 model's greedy text",
    "fast": "float32 matrices (fast path)",
    "fast-bf16": "bfloat16 matrices (fast path): the lossless modes give exactly this model's greedy text",
    "static": "fixed shapes replayed as CUDA graphs (mars.runtime.static), the default off the CPU",
    "hf": "transformers",
}


def backend_label(lm) -> str:
    """The backend every visitor's runs use on this model, in words (Model panel); for int8, what its matrices
    run on: 'C kernels, AVX2' (AVX-512 VNNI, AMX) or 'tensor fallback: <why>' (mars.runtime.kernels.status)."""
    name = app_run_backend(lm)
    if name == "fast-int8":
        from mars.runtime.kernels import status

        return f"{name}: {BACKEND_LABELS[name]}. int8 runs on {status()}"
    return f"{name}: {BACKEND_LABELS[name]}"


def max_prompt_tokens() -> int:
    """Server-side cap on a prompt's tokens (chat template included), whatever a client sends."""
    return settings.get().max_prompt_tokens


def max_prompt_chars() -> int:
    """Checked before tokenizing, so a megabyte of text costs no tokenizer time; generous per token."""
    return 16 * max_prompt_tokens()


def check_mode(mode) -> str:
    """The app's decoding mode from a UI label or a core name ("mars", "verified")."""
    return check_choice("mode", MODE_LABELS.get(mode, mode) if isinstance(mode, str) else mode, APP_MODES)


def sanitize_text(text: str) -> str:
    """Text the tokenizer and JSON both accept, otherwise as typed.

    Surrogate halves that form a pair are joined, lone ones (invalid in UTF-8, e.g. "\\ud800") become U+FFFD,
    and NUL is dropped. Other control characters, right-to-left marks, combining characters and emoji stay.
    """
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text.replace("\x00", "")


def check_prompt(prompt) -> str:
    """The prompt, sanitized; ValueError when it is empty or too long to be worth tokenizing."""
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise ValueError(f"the prompt must be text, got {type(prompt).__name__}")
    prompt = sanitize_text(prompt)
    if not prompt.strip():
        raise ValueError("the prompt is empty: type a question or pick an example")
    if len(prompt) > max_prompt_chars():
        raise ValueError(f"the prompt is too long ({len(prompt)} characters); prompts are limited to "
                         f"{max_prompt_tokens()} tokens on this server")
    return prompt


def encode_checked(lm, prompt: str, cfg: DecodeConfig) -> list[int]:
    """The prompt's ids through the chat template, within the server's cap and the model's context."""
    ids = encode_prompt(lm.tokenizer, prompt)
    cap = max_prompt_tokens()
    if len(ids) > cap:
        raise ValueError(f"the prompt is too long: {len(ids)} tokens with the chat template, at most {cap} "
                         "on this server")
    check_context(lm.model, len(ids), cfg)
    return ids


def make_config(
    mode: str, tau, block_size, max_new_tokens, confidence: str = "prob", top_k: int = TOP_K,
    cache_block=DEFAULT_CACHE_BLOCK, verify_groups: str = "last", backend: str | None = None, tree_nodes=0,
) -> DecodeConfig:
    """A DecodeConfig from UI or API values (ValueError with the core's message). DecodeConfig checks every
    setting; this server only caps two lower than the library, with the same checker.
    Verified mode runs at its best lossless setting: one mask group after all drafts (the fastest on a CPU),
    and each pass's drafts from the masks or copied from the text (n-gram lookup), whichever is expected to
    be accepted more (mars.decoding.modes.prefer_lookup); the inspector says which. backend: `app_backend()` unless
    given. tree_nodes > 0 (verified only; other modes ignore the slider): a draft tree of that many nodes per
    pass (mars.decoding.tree)."""
    return DecodeConfig(
        mode=mode,
        block_size=check_int("block size", block_size, 1, MAX_BLOCK),
        tau=tau,
        confidence=confidence,
        max_new_tokens=check_int("max new tokens", max_new_tokens, 1, max_new_tokens_limit()),
        cache_block=cache_block,
        top_k=top_k,
        verify_groups=verify_groups,
        drafts="both" if mode == "verified" else "mars",
        backend=backend or app_backend(),
        tree_nodes=check_int("tree nodes", tree_nodes, 0, MAX_TREE_NODES_APP) if mode == "verified" else 0,
    )


def fit_to_model(lm, cfg: DecodeConfig) -> tuple[DecodeConfig, list[str]]:
    """The run this model can do, and notes for the visitor: a model without a mask token runs plain AR;
    a block size beyond the trained one is allowed (it is an experiment worth making) but flagged. The backend
    is resolved for this model ("auto-int8" -> "fast-int8" or "hf"), so the trace names what ran."""
    from dataclasses import replace

    from mars.runtime.backends import resolve_backend

    cfg = replace(cfg, backend=resolve_backend(lm.model, cfg.backend))
    notes = []
    if cfg.mode != "ar" and lm.mask_token_id is None:
        notes.append("this model has no mask token, so it cannot draft: the run is plain AR, one token per pass")
        return replace(cfg, mode="ar", block_size=1, drafts="mars", tree_nodes=0), notes
    if cfg.tree_nodes and cfg.drafts != "mars" and app_datastore(lm):
        cfg = replace(cfg, datastore=True)
    costs = app_cut_costs(lm, cfg.backend)  # measured at warm-up (app_pass_costs); None under MARS_TREE_CUT=0
    if cfg.tree_nodes and cfg.pass_costs is None and costs is not None:
        # each pass sends only the nodes, and the mask group only while its drafts, pay for their inputs here
        cfg = replace(cfg, pass_costs=costs.by_width, group_cost=costs.group)
    trained = lm.trained_block_size
    if cfg.mode != "ar" and trained and cfg.block_size > trained:
        notes.append(f"block size {cfg.block_size} is larger than the {trained} this model was trained with: "
                     "masks past its training are rarely accepted")
    return cfg, notes
