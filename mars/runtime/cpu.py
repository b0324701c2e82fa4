"""This CPU's features, read once where asked: which ISA paths the kernels and oneDNN may take."""

from __future__ import annotations

import torch

from mars import settings


# oneDNN's own test before any bfloat16 matmul (mkldnn_bf16_device_check): one of these sets of CPU flags
ONEDNN_BF16_FLAGS = ({"avx_ne_convert"}, {"avx512bw", "avx512vl", "avx512dq"})


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo; None where that file does not exist (not Linux).

    `MARS_CPU_FLAGS` (space- or comma-separated) overrides them: with `ONEDNN_MAX_CPU_ISA=AVX2` it runs the whole
    test suite as an AVX2-only machine (an AMD EPYC, say) would, on a CPU that has more (README)."""
    forced = settings.get().cpu_flags
    if forced:
        return set(forced)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def bf16_unsupported_reason(flags: set[str] | None = None,
                            advice: str = "use backend 'fast' (float32, exact) instead of 'fast-bf16'") -> str | None:
    """None when oneDNN can run bfloat16 matrices on this CPU, else a message saying why not and, `advice`,
    what to use instead (the decoder's by default; the trainer passes its own).

    `flags` defaults to this CPU's (`cpu_flags`); tests pass other sets to check both answers anywhere.
    """
    flags = cpu_flags() if flags is None else flags
    if flags is None:  # no /proc/cpuinfo: ask PyTorch, which runs the same check
        ok = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    else:
        ok = torch.backends.mkldnn.is_available() and any(need <= flags for need in ONEDNN_BF16_FLAGS)
    if ok:
        return None
    return ("bfloat16 matrices need a CPU with AVX-512 (avx512bw, avx512vl, avx512dq) or AVX-NE-CONVERT, "
            f"and this one has neither (AVX2 only?): {advice}")
