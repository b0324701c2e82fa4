"""Two small C loops for the int8 fast path, compiled on first use with the machine's C compiler.

Why: an int8 pass streams a quarter of float32's bytes, but each of its 121 matrices also quantizes its
input rows and rescales its output, ~14 tensor ops in PyTorch at a few microseconds of dispatch each:
measured here, that overhead was a quarter of an int8 AR pass (6.7 of 24 ms). Each step is one loop over a
few thousand floats, so a plain C function called through ctypes (~0.3 microseconds a call) replaces it.

Built once per machine: the source, the flags and the compiler's version name a shared library in the cache
folder (`MARS_CACHE`, else ~/.cache/mars-playground), compiled with `-march=native` for this CPU (or AVX2 when
`MARS_CPU_FLAGS` says the CPU has no AVX-512, as the suite's AVX2-only run does) and `-ffp-contract=off`, so
the arithmetic is the one written below. Where no compiler works (`cc` missing, a read-only cache) or
`MARS_C_KERNELS=0`, `kernels()` returns None and mars.core.quant runs the same steps as tensor ops: same
integers, floats equal to rounding (tested against each other).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = r"""
#include <stdint.h>
#include <math.h>
#include <float.h>

/* One row at ~16 bits as two uint8 rows, as mars.core.quant.quantize_rows2: u = x * (127 / amax(|x|)),
   q = round(u), r = round((u - q) * 254); q + 128 and r + 128 stored, amax / 127 returned. round = nearbyintf
   in the default mode: half to even, as torch.round. */
static inline float quant_row(const float *row, int64_t k, uint8_t *q, uint8_t *r) {
    float amax = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        float a = fabsf(row[j]);
        amax = a > amax ? a : amax;
    }
    if (amax < FLT_MIN) amax = FLT_MIN;
    const float inv = 127.0f / amax;
    for (int64_t j = 0; j < k; j++) {
        float u = row[j] * inv;
        float qf = nearbyintf(u);
        q[j] = (uint8_t)(int)(qf + 128.0f);
        r[j] = (uint8_t)(int)(nearbyintf((u - qf) * 254.0f) + 128.0f);
    }
    return amax / 127.0f;
}

/* Rows of x (n x k, row stride ldx) -> out (2n x k) = [rows ; their residuals], sx (n). */
void mars_quant_rows2(const float *x, int64_t n, int64_t k, int64_t ldx, uint8_t *out, float *sx) {
    for (int64_t i = 0; i < n; i++) sx[i] = quant_row(x + i * ldx, k, out + i * k, out + (n + i) * k);
}

/* RMSNorm then quantize: h = x * (1 / sqrt(mean(x^2) + eps)) * w (written to h, n x k: the gated adapter's
   deltas read it), then h's rows as mars_quant_rows2. The mean is summed in double. */
void mars_rmsnorm_quant(const float *x, int64_t n, int64_t k, int64_t ldx, const float *w, float eps, float *h,
                        uint8_t *out, float *sx) {
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * ldx;
        double ss = 0.0;
        for (int64_t j = 0; j < k; j++) ss += (double)row[j] * row[j];
        const float r = 1.0f / sqrtf((float)(ss / (double)k) + eps);
        float *hr = h + i * k;
        for (int64_t j = 0; j < k; j++) hr[j] = row[j] * r * w[j];
        sx[i] = quant_row(hr, k, out + i * k, out + (n + i) * k);
    }
}

/* The MLP's activation then quantize: gu (n x 2k, row stride ld) = [gate | up]; a = silu(gate) * up
   (written to a, n x k), then a's rows as mars_quant_rows2. */
void mars_silu_mul_quant(const float *gu, int64_t n, int64_t k, int64_t ld, float *a, uint8_t *out, float *sx) {
    for (int64_t i = 0; i < n; i++) {
        const float *g = gu + i * ld, *u = g + k;
        float *ar = a + i * k;
        for (int64_t j = 0; j < k; j++) ar[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        sx[i] = quant_row(ar, k, out + i * k, out + (n + i) * k);
    }
}

/* y (n x m) = (q + r * (1/254)) * sx[row] * sw[col] (+ bias) (+ res): the rescale of the integer sums acc
   (2n x m) = [q ; r] of the rows and their residuals, as mars.core.quant.Int8Linear's tensor ops do it
   (add with alpha, which ATen computes as one fma). res: the residual stream to add (row stride ldr), or NULL. */
void mars_combine_rows2(const float *acc, int64_t n, int64_t m, const float *sx, const float *sw,
                        const float *bias, const float *res, int64_t ldr, float *y) {
    const float alpha = (float)(1.0 / 254.0);
    for (int64_t i = 0; i < n; i++) {
        const float *q = acc + i * m, *r = acc + (n + i) * m;
        const float s = sx[i];
        float *out = y + i * m;
        for (int64_t o = 0; o < m; o++) out[o] = fmaf(r[o], alpha, q[o]) * s * sw[o];
        if (bias) for (int64_t o = 0; o < m; o++) out[o] += bias[o];
        if (res) {
            const float *rr = res + i * ldr;
            for (int64_t o = 0; o < m; o++) out[o] = rr[o] + out[o];
        }
    }
}
"""

_LOCK = threading.Lock()
_STATE: dict = {}  # "lib": the loaded library or None, "why": why not


def _cache_dir() -> Path:
    return Path(os.environ.get("MARS_CACHE") or Path.home() / ".cache" / "mars-playground") / "kernels"


def _arch_flags() -> list[str]:
    from mars.core.fastpath import cpu_flags

    if os.environ.get("MARS_CPU_FLAGS") and "avx512f" not in (cpu_flags() or set()):
        return ["-mavx2", "-mfma"]  # the suite's AVX2-only run: code that an AVX2 CPU can run
    return ["-march=native"]


def _build() -> tuple[ctypes.CDLL | None, str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc/gcc) on PATH"
    flags = ["-O3", "-ffp-contract=off", "-fPIC", "-shared", *_arch_flags()]
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} does not run: {e}"
    key = hashlib.sha256("\0".join([SOURCE, *flags, version]).encode()).hexdigest()[:16]
    lib = _cache_dir() / f"mars_int8_{key}.so"
    if not lib.exists():
        try:
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
                src = Path(tmp) / "k.c"
                src.write_text(SOURCE)
                built = Path(tmp) / "k.so"
                done = subprocess.run([cc, *flags, str(src), "-o", str(built), "-lm"], capture_output=True,
                                      text=True, timeout=120)
                if done.returncode != 0:
                    return None, f"{cc} failed: {done.stderr.strip()[-300:]}"
                os.replace(built, lib)  # atomic: two processes building at once both end with a whole file
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"could not build the kernels in {lib.parent}: {e}"
    try:
        so = ctypes.CDLL(str(lib))
    except OSError as e:
        return None, f"could not load {lib}: {e}"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    so.mars_quant_rows2.argtypes = [ptr, i64, i64, i64, ptr, ptr]
    so.mars_quant_rows2.restype = None
    so.mars_combine_rows2.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, i64, ptr]
    so.mars_combine_rows2.restype = None
    so.mars_rmsnorm_quant.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_float, ptr, ptr, ptr]
    so.mars_rmsnorm_quant.restype = None
    so.mars_silu_mul_quant.argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr]
    so.mars_silu_mul_quant.restype = None
    return so, ""


def kernels() -> ctypes.CDLL | None:
    """The compiled library (built on the first call in this process), or None where it cannot be built
    or `MARS_C_KERNELS=0`; `unavailable_reason()` then says why."""
    if os.environ.get("MARS_C_KERNELS", "1") == "0":
        return None
    with _LOCK:
        if "lib" not in _STATE:
            _STATE["lib"], _STATE["why"] = _build()
        return _STATE["lib"]


def unavailable_reason() -> str | None:
    if os.environ.get("MARS_C_KERNELS", "1") == "0":
        return "MARS_C_KERNELS=0"
    return None if kernels() is not None else _STATE.get("why")


def quant_rows2(lib, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (n, k) float32, rows contiguous -> ((2n, k) uint8 [q + 128 ; r + 128], sx (n,)): see SOURCE."""
    n, k = x.shape
    out = torch.empty(2 * n, k, dtype=torch.uint8)
    sx = torch.empty(n)
    lib.mars_quant_rows2(x.data_ptr(), n, k, x.stride(0), out.data_ptr(), sx.data_ptr())
    return out, sx


def rmsnorm_quant(lib, x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (n, k) float32, last dimension contiguous -> (h = RMSNorm(x) * w (n, k), its rows quantized (2n, k)
    uint8, sx (n,)): see SOURCE."""
    n, k = x.shape
    h = torch.empty(n, k)
    out = torch.empty(2 * n, k, dtype=torch.uint8)
    sx = torch.empty(n)
    lib.mars_rmsnorm_quant(x.data_ptr(), n, k, x.stride(0), w.data_ptr(), eps, h.data_ptr(), out.data_ptr(),
                           sx.data_ptr())
    return h, out, sx


def silu_mul_quant(lib, gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gu (n, 2k) = [gate | up] float32 -> (a = silu(gate) * up (n, k), its rows quantized (2n, k) uint8, sx)."""
    n, k = gu.shape[0], gu.shape[1] // 2
    a = torch.empty(n, k)
    out = torch.empty(2 * n, k, dtype=torch.uint8)
    sx = torch.empty(n)
    lib.mars_silu_mul_quant(gu.data_ptr(), n, k, gu.stride(0), a.data_ptr(), out.data_ptr(), sx.data_ptr())
    return a, out, sx


def combine_rows2(lib, acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
                  res: torch.Tensor | None = None) -> torch.Tensor:
    """acc (2n, m) float32 contiguous -> (n, m): see SOURCE. sw (m,), bias (m,) float32; res: (n, m) rows to
    add (the residual stream), last dimension contiguous."""
    n, m = acc.shape[0] // 2, acc.shape[1]
    y = torch.empty(n, m)
    lib.mars_combine_rows2(acc.data_ptr(), n, m, sx.data_ptr(), sw.data_ptr(),
                           None if bias is None else bias.data_ptr(),
                           None if res is None else res.data_ptr(), 0 if res is None else res.stride(0), y.data_ptr())
    return y
