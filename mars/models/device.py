"""Where a model runs: one device setting for the CLI (`--device`), the app (`MARS_DEVICE`) and the trainer.

    auto  CUDA when torch sees a GPU, else the CPU
    cpu   the CPU, float32 by default (exact: the tests' token-for-token checks hold here)
    cuda  the first GPU, bfloat16 by default (a 135M model is host-bound there; bfloat16 halves the bytes)

Asking for CUDA where there is none is a `DeviceError` (a LoadError: every caller already prints those as
one line); running out of GPU memory is turned into one message by `oom_message` at the CLI and app edges.
"""

from __future__ import annotations

from mars import settings
from mars.models.errors import LoadError
from mars.runtime.names import DEVICES



class DeviceError(LoadError):
    """The asked-for device is not on this machine."""


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(name: str | None, available=cuda_available) -> str:
    """'auto' (or None) -> 'cuda' or 'cpu'; 'cuda' where torch sees no GPU is a DeviceError that says so."""
    name = (name or "auto").strip().lower()
    if name not in DEVICES:
        raise DeviceError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return "cuda" if available() else "cpu"
    if name == "cuda" and not available():
        import torch

        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise DeviceError(f"--device cuda: no CUDA GPU is visible here ({build}); use --device cpu or auto")
    return name


def default_dtype(device: str) -> str:
    """The weights' dtype when none is asked for: bfloat16 on a GPU, float32 (exact) on the CPU."""
    return "bfloat16" if device == "cuda" else "float32"


def env_device() -> str:
    """MARS_DEVICE for the app (mars.settings: auto, cpu or cuda), resolved on this machine."""
    name = settings.get().device
    try:
        return resolve_device(name)
    except DeviceError as e:
        raise DeviceError(f"MARS_DEVICE={name!r}: {e}") from None


def is_oom(exc: BaseException) -> bool:
    """True for torch's out-of-memory error (torch.OutOfMemoryError, alias torch.cuda.OutOfMemoryError)."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return oom is not None and isinstance(exc, oom)


def oom_message(advice: str = "use a smaller batch or a shorter length, or --device cpu") -> str:
    """One line for a run that ran out of GPU memory; frees what the allocator kept, so the next run may fit."""
    import torch

    free = ""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        try:
            f, total = torch.cuda.mem_get_info()
            free = f" ({f / 2**30:.1f} of {total / 2**30:.1f} GiB free now)"
        except RuntimeError:
            pass
    return f"out of GPU memory{free}: {advice}"


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): phase timings on CUDA mean nothing without it."""
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()
