"""The paper's own published checkpoints: a registry, and a loader that reports progress and says plainly
when the Hugging Face Hub cannot be reached.

Source of the registry: the authors' repository `Xalp/MARS`, README.md, section "Pretrained Models"
(its `scripts/upload_models.sh` names the same models). They are full fine-tunes of Qwen2.5-Instruct whose
config says `model_type: "a2d-qwen2"` and whose tokenizer carries `<|mask|>`; `mars.models.loading` loads them as
plain causal Qwen2, so they need no remote code and no adapter.

Left out on purpose: `Xalphinions/MARS-Qwen2.5-0.5B-BD3LM-blk4`, the block-diffusion baseline. It attends
bidirectionally inside a block, so this project's strictly causal decoder would run it wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_CHOICE = "smollm2"  # mars.models.loading.DEFAULT_MODEL: the embedded default with the project's adapter
SOURCE = "github.com/Xalp/MARS, README.md, 'Pretrained Models'"
CPU_SPACE_GB = 12.0  # float32 weights above this do not fit a free CPU Space's memory next to the app


@dataclass(frozen=True)
class PaperCheckpoint:
    hub_id: str
    base_model: str  # what the authors fine-tuned (AR SFT first, then MARS, same data)
    params_b: float  # parameters, billions (Qwen2.5-0.5B: 0.49, Qwen2.5-7B: 7.6)
    block_size: int | None  # B it was trained with; None for the AR SFT control (its masks are untrained)
    kind: str  # "mars" (with the SFT loss, the paper's method), "mars-no-sft" (ablation), "ar-sft" (control)
    note: str

    @property
    def float32_gb(self) -> float:
        """Memory of the weights in float32, how this app runs a model on CPU (an estimate: 4 bytes/param)."""
        return self.params_b * 4

    @property
    def fits_cpu_space(self) -> bool:
        return self.float32_gb <= CPU_SPACE_GB

    @property
    def label(self) -> str:
        size = f"{self.params_b:g}B"
        what = {"mars": f"MARS, B = {self.block_size}", "mars-no-sft": f"MARS without SFT loss, B = {self.block_size}",
                "ar-sft": "AR SFT control (no MARS)"}[self.kind]
        warn = "" if self.fits_cpu_space else f", needs ~{self.float32_gb:.0f} GB"
        return f"{what} · {size}{warn} — {self.hub_id}"


def _qwen(size: str, params: float, suffix: str, block: int | None, kind: str, note: str) -> PaperCheckpoint:
    return PaperCheckpoint(f"Xalphinions/MARS-Qwen2.5-{size}-{suffix}", f"Qwen/Qwen2.5-{size}-Instruct", params,
                           block, kind, note)


PAPER_CHECKPOINTS: tuple[PaperCheckpoint, ...] = (
    _qwen("0.5B", 0.49, "blk4", 4, "mars", "the paper's main 0.5B model"),
    _qwen("0.5B", 0.49, "blk8", 8, "mars", "block-size ablation"),
    _qwen("0.5B", 0.49, "blk16", 16, "mars", "block-size ablation"),
    _qwen("0.5B", 0.49, "AR-SFT", None, "ar-sft", "the AR baseline MARS starts from: run it at tau = 1 or AR"),
    _qwen("0.5B", 0.49, "blk4-no-sft", 4, "mars-no-sft", "trained without the clean-stream loss: quality erodes"),
    _qwen("0.5B", 0.49, "blk8-no-sft", 8, "mars-no-sft", "trained without the clean-stream loss"),
    _qwen("0.5B", 0.49, "blk16-no-sft", 16, "mars-no-sft", "trained without the clean-stream loss"),
    _qwen("7B", 7.6, "blk4", 4, "mars", "the paper's headline model; needs a large machine"),
    _qwen("7B", 7.6, "blk8", 8, "mars", "block-size ablation; needs a large machine"),
    _qwen("7B", 7.6, "blk16", 16, "mars", "block-size ablation; needs a large machine"),
    _qwen("7B", 7.6, "AR-SFT", None, "ar-sft", "the 7B AR baseline; needs a large machine"),
)


def find_checkpoint(hub_id: str) -> PaperCheckpoint | None:
    return next((c for c in PAPER_CHECKPOINTS if c.hub_id == hub_id), None)


def model_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for a dropdown: the default first, then the paper's checkpoints."""
    default = ("SmolLM2-135M-Instruct + this project's MARS adapter (default, no download)", DEFAULT_CHOICE)
    return [default] + [(c.label, c.hub_id) for c in PAPER_CHECKPOINTS]


def in_local_cache(hub_id: str) -> bool:
    """True when the Hub id's config is in the local Hugging Face cache (it may load with no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)
    except Exception:
        return False


def _hub_reachable() -> bool:
    from mars.models.loading import hub_offline

    return not hub_offline()


def unreachable_message(hub_id: str) -> str:
    return (f"The Hugging Face Hub cannot be reached from this server, so {hub_id} cannot be downloaded, and it is "
            "not in the local cache. Run the app where it has internet access, or download the checkpoint "
            "elsewhere and give its local folder. The current model keeps serving.")


def load_checkpoint(
    name: str,
    progress: Callable[[float, str], None] | None = None,
    *,
    load_fn: Callable | None = None,
    reachable: Callable[[], bool] | None = None,
    cached: Callable[[str], bool] | None = None,
) -> tuple[object | None, str]:
    """(LoadedModel or None, message) for a registry Hub id, the default, a local folder or another Hub id.

    Never raises: on failure the message says why and the caller's current model keeps serving.
    progress(fraction, message) is told each stage; a Hub id that is neither reachable nor cached is refused
    at once, before any slow attempt. The registry fills in the trained block size the checkpoints do not
    record themselves.
    """
    from mars.models.loading import LoadError, load

    load_fn = load_fn or load
    reachable = reachable or _hub_reachable
    cached = cached or in_local_cache
    report = progress or (lambda fraction, message: None)
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        return None, "Pick a checkpoint from the list."
    entry = find_checkpoint(name)
    is_local = name == DEFAULT_CHOICE or Path(name).expanduser().exists()
    if not is_local:
        report(0.0, f"checking whether the Hugging Face Hub can be reached for {name}…")
        if not cached(name) and not reachable():
            return None, unreachable_message(name)
    where = "from the local cache" if not is_local and cached(name) else (
        "from disk" if is_local else f"downloading{f' {entry.params_b:g}B parameters' if entry else ''} from the Hub")
    report(0.1, f"loading {name} ({where}; this can take minutes)…")
    try:
        lm = load_fn(name, "auto" if name == DEFAULT_CHOICE else "none")
    except LoadError as e:
        return None, f"Could not load {name}: {e}. The current model keeps serving."
    except Exception as e:  # anything else must not take the app down either
        return None, f"Could not load {name}: {type(e).__name__}: {e}. The current model keeps serving."
    if entry is not None:
        if getattr(lm, "trained_block_size", None) is None and entry.block_size is not None:
            lm.trained_block_size = entry.block_size
        if entry.kind == "ar-sft":
            lm.warnings.append("this is the paper's AR SFT control: its mask predictions were never trained, so "
                               "expect about one token per pass (use it as the AR reference)")
        elif entry.kind == "mars-no-sft":
            lm.warnings.append("an ablation trained without the clean-stream (SFT) loss: the paper shows its "
                               "quality erodes, more so for larger blocks")
    report(1.0, f"loaded {name}")
    trained = f", trained block size {lm.trained_block_size}" if getattr(lm, "trained_block_size", None) else ""
    return lm, f"Loaded {name}{trained}."
