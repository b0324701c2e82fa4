"""How much memory and disk a model needs, known before any of its weights are downloaded, and how much the
machine has free.

Why before: a checkpoint far larger than the machine fills the disk while it downloads, then exhausts the
memory while it loads, and the server goes down for every visitor. The Hub's file metadata (sizes of the
files, and the parameter count it reads from the safetensors headers) answers the question for the price of
one small API call; a local folder answers it from its own safetensors headers (a few KB each).

Memory is counted as this app runs a model on CPU: float32, 4 bytes a parameter (`mars.models.loading.load`
defaults to float32). The current model stays in memory until the new one has loaded and passed its first
pass, so the new one must fit beside it: MemAvailable already excludes the current model.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

GiB = 1024 ** 3
FLOAT32_BYTES = 4
# Kept free besides the new weights: the app itself, a run's activations, the loader's transient copies
# (one shard converted from 16-bit at a time), and the OS's page cache needs.
MEMORY_RESERVE = 1 * GiB
DISK_RESERVE = 1 * GiB  # the cache's disk also holds the app's run files and Gradio's upload cache
MAX_HEADER = 100 * 1024 * 1024  # a safetensors header larger than this is not one


class SizeError(RuntimeError):
    """The model cannot be sized, or it would not fit: the message says which, for a visitor."""


@dataclass(frozen=True)
class WeightsSize:
    name: str  # as the visitor named it (a Hub id or a folder's name)
    params: int | None  # parameters (the Hub's metadata or the safetensors headers); None when unknown
    weight_bytes: int  # the safetensors files as stored
    download_bytes: int  # of those, the bytes not yet in the local Hugging Face cache

    @property
    def memory_bytes(self) -> int:
        """float32 in memory; with no parameter count, the files read as 16-bit weights (x2): the common
        case, and an upper bound for 32-bit files."""
        if self.params is not None:
            return self.params * FLOAT32_BYTES
        return self.weight_bytes * 2


def gb(n: float) -> str:
    return f"{n / GiB:.1f} GB"


def hub_model_info(repo_id: str):
    """The Hub's metadata of a model repository, with every file's size (one API call, no download)."""
    from huggingface_hub import HfApi

    return HfApi().model_info(repo_id, files_metadata=True, timeout=10)


def in_cache(repo_id: str, filename: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, filename), str)
    except Exception:  # noqa: BLE001 - an unreadable cache counts as empty: the download is counted
        return False


def hub_weights_size(repo_id: str, model_info: Callable | None = None,
                     cached: Callable[[str, str], bool] = in_cache) -> WeightsSize:
    """Size a Hub model from its metadata. model_info(repo_id) -> huggingface_hub ModelInfo (injectable:
    tests serve a fake Hub). Raises SizeError when the Hub cannot answer or the repo has no safetensors."""
    try:
        info = (model_info or hub_model_info)(repo_id)
    except Exception as e:  # noqa: BLE001 - not found, gated, offline: one message, nothing downloaded
        raise SizeError(f"could not read {repo_id}'s file sizes from the Hugging Face Hub, so it is not loaded "
                        f"({type(e).__name__}: {_first_line(e)})") from None
    weights = [s for s in (getattr(info, "siblings", None) or []) if s.rfilename.endswith(".safetensors")]
    if not weights:
        raise SizeError(f"{repo_id} has no safetensors weights on the Hub (only safetensors are loaded here)")
    if any(s.size is None for s in weights):
        raise SizeError(f"the Hub gave no file sizes for {repo_id}, so it is not loaded")
    st = getattr(info, "safetensors", None)
    params = int(st.total) if st is not None and getattr(st, "total", None) else None
    return WeightsSize(repo_id, params, sum(s.size for s in weights),
                       sum(s.size for s in weights if not cached(repo_id, s.rfilename)))


def folder_weights_size(folder: Path, name: str | None = None) -> WeightsSize:
    """Size a local folder (or a cached Hub snapshot) from its safetensors headers: nothing to download."""
    files = sorted(Path(folder).glob("*.safetensors"))
    params = 0
    for path in files:
        params += safetensors_params(path)
    return WeightsSize(name or Path(folder).name, params if files else None,
                       sum(p.stat().st_size for p in files), 0)


def safetensors_params(path: Path) -> int:
    """Parameters in one safetensors file, from its header: 8 bytes of length, then JSON {name: {shape}}."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(f.read(n))
        return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise SizeError(f"{path.name} is not a readable safetensors file ({type(e).__name__})") from None


def free_memory_bytes() -> int:
    """Memory the kernel can give without swapping (MemAvailable), else the free pages (os.sysconf)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def hub_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def free_disk_bytes(path: Path | None = None) -> int:
    """Free bytes on the disk of the Hugging Face cache (its nearest existing folder: it may not exist yet)."""
    path = Path(path or hub_cache_dir()).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_fits(size: WeightsSize, free_memory: Callable[[], int] = free_memory_bytes,
               free_disk: Callable[[], int] = free_disk_bytes) -> None:
    """Raise SizeError with a visitor's message when the weights would not fit the machine's free memory or
    the cache's free disk (each with its reserve)."""
    params = f" ({size.params / 1e9:.2f}B parameters as float32)" if size.params else " (as float32)"
    mem, have = size.memory_bytes, free_memory()
    if mem + MEMORY_RESERVE > have:
        raise SizeError(f"{size.name} needs about {gb(mem)} of memory{params}, and this machine has "
                        f"{gb(have)} free ({gb(MEMORY_RESERVE)} of it kept for the app): refused before any download")
    if size.download_bytes:
        disk = free_disk()
        if size.download_bytes + DISK_RESERVE > disk:
            raise SizeError(f"{size.name} would download {gb(size.download_bytes)} of weights, and the disk of "
                            f"the Hugging Face cache has {gb(disk)} free ({gb(DISK_RESERVE)} of it kept): refused "
                            "before any download")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]
