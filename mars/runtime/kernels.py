"""C kernels for the int8 fast path, compiled on first use with the machine's C compiler.

Why: an int8 pass streams a quarter of float32's bytes, but PyTorch's kernels did not turn that into speed
here. Each of the 121 matrices also quantized its input rows and rescaled its output in ~14 tensor ops of a
few microseconds of dispatch each (6.7 of a 24 ms int8 AR pass), and the integer products ran at half the
memory speed the float ones reach (oneDNN picks AMX tiles for 2 rows here, and is 4x slower than that on an
AVX2-only CPU). These functions, called through ctypes (~0.3 microseconds a call), do both:
  - `mars_quant_rows` (and the same after RMSNorm, or after SiLU * up): a row to one uint8 row and its
    OUTLIERS largest values in float (mars.runtime.quant's rule);
  - `mars_gemv_rows`: the product of up to MAX_C_ROWS rows (one per token) with the weights, blocked so that
    each instruction multiplies 4 bytes of a row by 4 bytes of 16 (AVX-512 VNNI) or 8 (AVX2) output
    channels, with the outliers, the rescale, bias, residual add and gated delta fused in; threads from
    torch's own OpenMP pool;
  - `mars_lora_rows`: the gated adapter's float deltas at the mask rows only (the mask rows of a MARS pass).

The C is in mars/runtime/csrc/: `mars_kernels.h` declares every function and struct Python uses (and the
limits, MAX_C_ROWS and the rest, which are read from it here: mars.runtime.c_header), `kernels.c` and
`layers.c` (the attention and layer loop: mars.runtime.cpu_layers) define them, `mars_internal.h` holds what
the two share. Every wrapper below checks its tensors' dtype, shape, contiguity and device before a pointer
crosses over, and raises TypeError / ValueError.

Built once per machine (`build`): the sources, the flags, the compiler's version and the CPU's flags name a
shared library in the cache folder (`MARS_CACHE`, else ~/.cache/mars-playground), compiled with
`-march=native` for this CPU (or AVX2 when `MARS_CPU_FLAGS` says the CPU has no AVX-512, as the suite's
AVX2-only run does) and `-ffp-contract=off`, so the arithmetic is the one written in the sources
(`-fno-trapping-math` only lets it vectorize the clamps of a loop; no value changes); `MARS_C_FLAGS` adds
flags (the sanitizer build of the tests). Where no compiler works (`cc` missing, a read-only cache) or
`MARS_C_KERNELS=0`, `kernels()` returns None and mars.runtime.quant runs the same steps as tensor ops and
oneDNN: the same integers, floats equal to rounding (tested against each other). A compiler that fails says
so once (a RuntimeWarning with its first error lines); `status()` names what int8 runs on.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from mars import settings
from mars.runtime.c_header import Header, parse

CSRC = Path(__file__).with_name("csrc")  # the C sources, shipped as package data
SOURCES = ("kernels.c", "layers.c")  # compiled into one library; their headers sit beside them
HEADER: Header = parse((CSRC / "mars_kernels.h").read_text())

MAX_C_ROWS = HEADER.constants["MARS_MAX_ROWS"]  # rows (batch x width) the C product and layer loop take at most
OUTLIERS = HEADER.constants["MARS_OUTLIERS"]  # a row's largest values kept in float (mars.runtime.quant)
MAX_LORA_COLUMNS = HEADER.constants["MARS_MAX_LORA_COLUMNS"]  # the C delta's t = A h values per row at most
LORA_BLOCK = HEADER.constants["MARS_LORA_BLOCK"]  # outputs per stored block of B
PAD = HEADER.constants["MARS_PAD"]  # the C product reads rows of a multiple of this many bytes
MAX_HEAD_DIM = HEADER.constants["MARS_MAX_HEAD_DIM"]  # mars_attend's rotary buffer
ISA_NAMES = {HEADER.constants["MARS_ISA_PLAIN"]: "plain C", HEADER.constants["MARS_ISA_AVX2"]: "AVX2",
             HEADER.constants["MARS_ISA_AVX512"]: "AVX-512", HEADER.constants["MARS_ISA_AVX512_VNNI"]: "AVX-512 VNNI"}

_LOCK = threading.Lock()
_STATE: dict = {}  # "build": this process's Build (made by the first kernels() call)


def _cache_dir() -> Path:
    return settings.get().cache / "kernels"


def _arch_flags() -> list[str]:
    from mars.runtime.cpu import cpu_flags

    if settings.get().cpu_flags and "avx512f" not in (cpu_flags() or set()):
        return ["-mavx2", "-mfma", "-mf16c"]  # the suite's AVX2-only run: code that an AVX2 CPU can run
    return ["-march=native"]


def _cpu_key() -> str:
    from mars.runtime.cpu import cpu_flags

    return " ".join(sorted(cpu_flags() or ()))


def compile_flags() -> list[str]:
    """The compiler flags the kernels are built with, OpenMP and MARS_C_FLAGS aside."""
    # functions and loops on 64-byte lines: where the products' inner loops fell depended on what else the
    # library held, and a change to the attention (layers.c, the same kernels.c) once made every product ~7%
    # slower on a Zen 3 core until its loops were aligned (benchmarks/kernel_ab, docs/int8.md)
    return ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-falign-functions=64", "-falign-loops=64", "-fPIC",
            "-shared", *_arch_flags()]


def env_flags() -> list[str]:
    """MARS_C_FLAGS: flags added to every build of this process (the sanitizer run of the kernel tests)."""
    return list(settings.get().c_flags)


def _named_compiler() -> str | None:
    """$CC (the compiler's own variable), else cc or gcc on PATH: what a build runs."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compiler() -> str | None:
    """The C compiler the kernels are built with: $CC, else cc or gcc on PATH; None where there is none."""
    cc = _named_compiler()
    return cc if cc and shutil.which(cc) else None


def _first_errors(stderr: str, lines: int = 3) -> str:
    """The compiler's first error and the lines after it (its message), else the end of what it said."""
    out = stderr.strip().splitlines()
    at = next((i for i, line in enumerate(out) if "error" in line), max(0, len(out) - lines))
    return " | ".join(line.strip() for line in out[at:at + lines])


@dataclass(frozen=True)
class Build:
    """One build of the kernels: the loaded library, or None and why not."""

    lib: ctypes.CDLL | None
    why: str = ""  # where lib is None: what failed (the compiler's first error lines)
    path: Path | None = None  # the shared library

    def status(self) -> str:
        """What int8 runs on, in words: 'C kernels, AVX-512 VNNI' (AMX, AVX2, ...) or 'tensor fallback: <why>'."""
        if self.lib is None:
            return f"tensor fallback: {self.why}"
        if self.lib.amx:
            return "C kernels, AMX"
        return f"C kernels, {ISA_NAMES.get(self.lib.mars_isa(), 'unknown ISA')}"


def build(sources: Path = CSRC, out_dir: Path | None = None, extra_flags: Sequence[str] = (),
          header: Header | None = None) -> Build:
    """The kernels compiled from `sources` (a folder holding SOURCES and their headers) into `out_dir` (default:
    the cache folder) with compile_flags() + extra_flags, OpenMP where the compiler has it, and loaded;
    `header` (default: this package's) declares its functions. A library already built with the same sources,
    flags, compiler and CPU is loaded as it is."""
    cc = _named_compiler()
    if not cc:
        return Build(None, "no C compiler (cc/gcc) on PATH")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return Build(None, f"{cc} does not run: {e}")
    try:
        texts = [f"{p.name}\0{p.read_text()}" for p in sorted(sources.iterdir()) if p.suffix in (".c", ".h")]
    except OSError as e:
        return Build(None, f"cannot read the C sources in {sources}: {e}")
    out_dir = Path(out_dir) if out_dir is not None else _cache_dir()
    base = compile_flags() + list(extra_flags)
    why = ""
    for flags in (base + ["-fopenmp"], base):  # without OpenMP (a compiler that lacks it): one thread
        # the CPU's flags too: -march=native code from another machine (an image built elsewhere) could hold
        # instructions this CPU lacks
        key = hashlib.sha256("\0".join([*texts, *flags, version, _cpu_key()]).encode()).hexdigest()[:16]
        lib = out_dir / f"mars_int8_{key}.so"
        why = _compile(cc, flags, sources, lib)
        if not why:
            return load(lib, header)
        if "omp" not in why.lower():
            break  # an error in the sources: the same without OpenMP
    return Build(None, why)


def _compile(cc: str, flags: list[str], sources: Path, lib: Path) -> str:
    """Builds `lib` unless it exists; '' when it is there, else why not."""
    if lib.exists():
        return ""
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            built = Path(tmp) / "k.so"
            done = subprocess.run([cc, *flags, *(str(sources / s) for s in SOURCES), "-o", str(built), "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                return f"{Path(cc).name} failed: {_first_errors(done.stderr)}"
            os.replace(built, lib)  # atomic: two processes building at once both end with a whole file
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not build the kernels in {lib.parent}: {e}"
    return ""


def load(lib: Path, header: Header | None = None) -> Build:
    """A built library, its functions declared from `header` (default: this package's mars_kernels.h)."""
    try:
        so = ctypes.CDLL(str(lib))
        (header or HEADER).declare(so)
    except (OSError, AttributeError) as e:
        return Build(None, f"could not load {lib}: {e}", lib)
    # AMX where built for it, the OS grants the tiles, and MARS_AMX is not 0; else the VNNI / AVX2 product
    so.amx = bool(so.mars_has_amx()) and settings.get().amx and bool(so.mars_amx_init())
    return Build(so, "", lib)


def kernels() -> ctypes.CDLL | None:
    """The compiled library (built on the first call in this process), or None where it cannot be built
    or `MARS_C_KERNELS=0`; `unavailable_reason()` then says why. A failed build warns once."""
    if not settings.get().c_kernels:
        return None
    with _LOCK:
        if "build" not in _STATE:
            _STATE["build"] = b = build(extra_flags=env_flags())
            if b.lib is None and compiler() is not None:
                warnings.warn(f"mars: the int8 C kernels did not build, int8 runs as tensor ops (about 2x "
                              f"slower): {b.why}", RuntimeWarning, stacklevel=2)
        return _STATE["build"].lib


def unavailable_reason() -> str | None:
    if not settings.get().c_kernels:
        return "MARS_C_KERNELS=0"
    return None if kernels() is not None else _STATE["build"].why


def skip_reason() -> str | None:
    """Why the kernels are not expected here (switched off, or no C compiler), else None. A test that needs
    them skips for this reason only: where a compiler exists and the build fails, it fails."""
    if not settings.get().c_kernels:
        return "MARS_C_KERNELS=0"
    return None if compiler() is not None else "no C compiler (cc/gcc) on PATH"


def status() -> str:
    """What the int8 matrices run on in this process: 'C kernels, AVX-512 VNNI' (AVX2, AMX, ...) or
    'tensor fallback: <why>' (the Model panel and the CLI say it)."""
    why = unavailable_reason()
    return f"tensor fallback: {why}" if why else _STATE["build"].status()


# Every wrapper checks what it hands to C (lesson 15): a wrong dtype, shape or stride would read or write
# past a tensor's memory without a word.
def check_tensor(name: str, t, dtype: torch.dtype, shape: tuple, rows: bool = False) -> None:
    """Raise unless t is a CPU tensor of `dtype` and `shape` (None: any size) and contiguous (rows: its rows
    may sit apart, each row contiguous; the C takes the row stride)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if rows:
        if t.dim() != 2 or t.stride(1) != 1 or (t.shape[0] > 1 and t.stride(0) < t.shape[1]):
            raise ValueError(f"{name} must have contiguous rows, got strides {t.stride()}")
    elif not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def check_row_indices(rows, n: int) -> None:
    """Gated row indices: int64, contiguous, at most MAX_C_ROWS, each in [0, n)."""
    check_tensor("rows", rows, torch.long, (None,))
    if rows.numel() > MAX_C_ROWS:
        raise ValueError(f"the C delta takes at most {MAX_C_ROWS} rows, got {rows.numel()}")
    if rows.numel():
        lo, hi = rows.aminmax()
        if lo < 0 or hi >= n:
            raise ValueError(f"row indices must be in [0, {n}), got {rows.tolist()}")


def padded(k: int) -> int:
    """The row length the C product reads: k rounded up to a multiple of PAD (zero-padded weights)."""
    return -(-k // PAD) * PAD


QRowsC = HEADER.structs["qrows"]  # mars_kernels.h's qrows as a ctypes.Structure


class QRows:
    """Rows quantized for the C product: q (n, kp) uint8 (value + 128), sx (n,) their scales, ov (n, OUTLIERS)
    float32 and oi (n, OUTLIERS) int32 their outliers; `c` the same as mars_kernels.h's qrows (the tensors
    keep the memory alive)."""

    def __init__(self, q: torch.Tensor, sx: torch.Tensor, ov: torch.Tensor, oi: torch.Tensor):
        check_tensor("q", q, torch.uint8, (None, None), rows=True)
        n = q.shape[0]
        check_tensor("sx", sx, torch.float32, (n,))
        check_tensor("ov", ov, torch.float32, (n, OUTLIERS))
        check_tensor("oi", oi, torch.int32, (n, OUTLIERS))
        self.q, self.sx, self.ov, self.oi = q, sx, ov, oi
        self.n, self.kp = n, q.shape[1]
        self.c = QRowsC(q.data_ptr(), n, q.stride(0) if n > 1 else q.shape[1], sx.data_ptr(), ov.data_ptr(),
                        oi.data_ptr())

    @classmethod
    def empty(cls, n: int, kp: int) -> "QRows":
        return cls(torch.empty(n, kp, dtype=torch.uint8), torch.empty(n), torch.empty(n, OUTLIERS),
                   torch.empty(n, OUTLIERS, dtype=torch.int32))

    def tile(self, i0: int, i1: int) -> "QRows":
        """Rows [i0, i1), sharing the memory."""
        return QRows(self.q[i0:i1], self.sx[i0:i1], self.ov[i0:i1], self.oi[i0:i1])


def quant_rows(lib, x: torch.Tensor, kp: int | None = None) -> QRows:
    """x (n, k) float32, rows contiguous -> QRows with rows of kp bytes: see kernels.c (the bits of
    mars.runtime.quant.quantize_rows)."""
    check_tensor("x", x, torch.float32, (None, None), rows=True)
    n, k = x.shape
    out = QRows.empty(n, _row_length(k, kp))
    lib.mars_quant_rows(x.data_ptr(), k, x.stride(0), ctypes.byref(out.c))
    return out


def _row_length(k: int, kp: int | None) -> int:
    kp = kp or k
    if kp < k:
        raise ValueError(f"the quantized rows' length {kp} is shorter than the rows' {k}")
    return kp


def rmsnorm_quant(lib, x: torch.Tensor, w: torch.Tensor, eps: float, kp: int | None = None):
    """x (n, k) float32, rows contiguous, w (k,) float32 -> (h = RMSNorm(x) * w (n, k), its rows quantized:
    QRows): see kernels.c."""
    check_tensor("x", x, torch.float32, (None, None), rows=True)
    n, k = x.shape
    check_tensor("w", w, torch.float32, (k,))
    h = torch.empty(n, k)
    out = QRows.empty(n, _row_length(k, kp))
    lib.mars_rmsnorm_quant(x.data_ptr(), k, x.stride(0), w.data_ptr(), eps, h.data_ptr(), ctypes.byref(out.c))
    return h, out


def silu_mul_quant(lib, gu: torch.Tensor, kp: int | None = None):
    """gu (n, 2k) = [gate | up] float32, rows contiguous -> (a = silu(gate) * up (n, k), its rows quantized:
    QRows)."""
    check_tensor("gu", gu, torch.float32, (None, None), rows=True)
    if gu.shape[1] % 2:
        raise ValueError(f"gu holds [gate | up]: an even width, got {gu.shape[1]}")
    n, k = gu.shape[0], gu.shape[1] // 2
    a = torch.empty(n, k)
    out = QRows.empty(n, _row_length(k, kp))
    lib.mars_silu_mul_quant(gu.data_ptr(), k, gu.stride(0), a.data_ptr(), ctypes.byref(out.c))
    return a, out


def block_weights(lib, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 weights (m, k) -> (the C product's blocked copy (see kernels.c), zero-padded: (mp / OB, kp / 4, OB,
    4) int8 with OB = mars_block(); wsum (m,) int32 row sums)."""
    check_tensor("q", q, torch.int8, (None, None), rows=True)
    ob = lib.mars_block()
    m, k = q.shape
    mp, kp = -(-m // ob) * ob, padded(k)
    full = torch.zeros(mp, kp, dtype=torch.int8)
    full[:m, :k] = q
    blocked = full.view(mp // ob, ob, kp // 4, 4).permute(0, 2, 1, 3).contiguous()  # [blk][t][c][q]
    return blocked, q.sum(dim=1, dtype=torch.int32)


def gemv_rows(lib, xq: QRows, w: torch.Tensor, wsum: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
              res: torch.Tensor | None = None, delta: tuple | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The product and rescale in one (see kernels.c): xq (QRows: n <= MAX_C_ROWS rows of kp bytes, kp a
    multiple of PAD), w blocked by `block_weights`, wsum (m,) int32, sw (m,), bias (m,) or None, res (n, m) or
    None (float32; res's rows contiguous) -> y (n, m) float32 (written to `out`, rows contiguous, if given).
    delta: None, or (h (n, k) float32 rows, gated row indices (int64, at most MAX_C_ROWS), LoraWeights): the
    gated adapter's delta added in the same call, the same bits as `lora_rows` after it."""
    if not isinstance(xq, QRows):
        raise TypeError(f"xq must be QRows (quant_rows), got {type(xq).__name__}")
    check_tensor("wsum", wsum, torch.int32, (None,))
    n, m = xq.n, wsum.shape[0]
    if n > MAX_C_ROWS:
        raise ValueError(f"the C product takes at most {MAX_C_ROWS} rows, got {n}")
    kp, ob = xq.kp, lib.mars_block()
    if kp % PAD:
        raise ValueError(f"xq's rows must hold a multiple of {PAD} bytes (padded(k)), got {kp}")
    check_tensor("w", w, torch.int8, (-(-m // ob), kp // 4, ob, 4))
    check_tensor("sw", sw, torch.float32, (m,))
    if bias is not None:
        check_tensor("bias", bias, torch.float32, (m,))
    if res is not None:
        check_tensor("res", res, torch.float32, (n, m), rows=True)
    if out is None:
        out = torch.empty(n, m)
    check_tensor("out", out, torch.float32, (n, m), rows=True)
    h = rows = lw = None
    if delta is not None:
        h, rows, lw = delta
        check_tensor("h", h, torch.float32, (n, lw.c.k), rows=True)
        check_row_indices(rows, n)
        if lw.m > m:
            raise ValueError(f"the delta writes {lw.m} outputs, the product has {m}")
    (lib.mars_gemv_amx if lib.amx else lib.mars_gemv_rows)(
        ctypes.byref(xq.c), w.data_ptr(), wsum.data_ptr(), m, kp, sw.data_ptr(),
        None if bias is None else bias.data_ptr(), None if res is None else res.data_ptr(),
        0 if res is None else res.stride(0), out.data_ptr(), out.stride(0) if n > 1 else m,
        None if h is None else h.data_ptr(), 0 if h is None else h.stride(0),
        None if rows is None else rows.data_ptr(), 0 if rows is None else rows.numel(),
        None if lw is None else ctypes.byref(lw.c))
    return out


LoraW = HEADER.structs["lora_w"]  # mars_kernels.h's lora_w as a ctypes.Structure


LORA_MAX = 127  # the gated deltas' int8 range (float math: no pair sums to saturate, the whole range)


def quantize_lora(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(A_q, s_a, B_q, s_b): a (R, k) and b (m, R) in int8, one float32 scale per row of A and per output of B
    (rows of zeros: scale 0). A = A_q * s_a[:, None], B = B_q * s_b[:, None] to half a step."""
    def rows(w):
        s = w.abs().amax(dim=1) / LORA_MAX
        q = torch.where(s[:, None] > 0, w / s.clamp_min(torch.finfo(torch.float32).tiny)[:, None], 0.0)
        return q.round().to(torch.int8), s

    return (*rows(a.float()), *rows(b.float()))


def dequantized_lora(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The deltas the C kernels add, as float32 (a, b): what the tensor ops use beside them."""
    aq, sa, bq, sb = quantize_lora(a, b)
    return aq.float() * sa[:, None], bq.float() * sb[:, None]


class LoraWeights:
    """A fused Linear's gated deltas laid out for the C kernels: A transposed (k, R) and B's non-zero blocks
    in blocks of LORA_BLOCK outputs, in int8 with float32 scales (quantize_lora); `None` from `of` where they
    do not fit that (see kernels.c)."""

    def __init__(self, at: torch.Tensor, sa: torch.Tensor, bt: torch.Tensor, sb: torch.Tensor, seg: torch.Tensor):
        check_tensor("at", at, torch.int8, (None, None))
        check_tensor("sa", sa, torch.float32, (at.shape[1],))
        check_tensor("bt", bt, torch.int8, (None,))
        check_tensor("sb", sb, torch.float32, (None,))
        check_tensor("seg", seg, torch.long, (None,))
        if at.shape[1] % 16 or at.shape[1] > MAX_LORA_COLUMNS or seg.numel() % 5:
            raise ValueError(f"A's rank {at.shape[1]} (a multiple of 16, at most {MAX_LORA_COLUMNS}) or the "
                             f"segments ({seg.numel()} values, 5 each) do not fit the C delta")
        self.at, self.sa, self.bt, self.sb, self.seg = at, sa, bt, sb, seg
        s = seg.view(-1, 5)  # first output, outputs, first column, columns, offset: every read within bt and t
        if len(s) and ((s[:, 2] + s[:, 3] > at.shape[1]).any()
                       or (s[:, 4] + -(-s[:, 1] // LORA_BLOCK) * LORA_BLOCK * s[:, 3] > bt.numel()).any()):
            raise ValueError("a segment of B reads past A's columns or B's values")
        self.m = int((s[:, 0] + s[:, 1]).max()) if len(s) else 0  # outputs written: [0, m)
        if sb.numel() < self.m:
            raise ValueError(f"B's scales cover {sb.numel()} outputs, its segments write {self.m}")
        # the same, as mars_kernels.h's lora_w (the tensors above keep the memory alive)
        self.c = LoraW(at.data_ptr(), sa.data_ptr(), at.shape[1], at.shape[0], bt.data_ptr(), sb.data_ptr(),
                       seg.data_ptr(), seg.numel() // 5)

    @classmethod
    def of(cls, a: torch.Tensor, b: torch.Tensor, out_sizes: list[int]) -> "LoraWeights | None":
        """a (R, k), b (m, R) block-diagonal by the fused modules' outputs `out_sizes` (GatedLoRA.fused), in
        int8 (quantize_lora), or None when R is too large for the kernel's buffer (the float tensor ops then)."""
        R, k = a.shape
        Rp = -(-R // 16) * 16
        if Rp > MAX_LORA_COLUMNS:
            return None
        aq, sa, bq, sb = quantize_lora(a, b)
        at = torch.zeros(k, Rp, dtype=torch.int8)
        at[:, :R] = aq.t()
        sap = torch.zeros(Rp)
        sap[:R] = sa
        seg, blocks, off, o_lo = [], [], 0, 0
        for m in out_sizes:
            part = bq[o_lo:o_lo + m]
            cols = part.abs().sum(dim=0).nonzero().flatten()  # this module's block: its non-zero columns
            if len(cols):
                r_lo, r_hi = int(cols[0]), int(cols[-1]) + 1
                # blocks of LB outputs, each as (columns, LB): range_delta reads one contiguous piece per block
                mp = -(-m // LORA_BLOCK) * LORA_BLOCK
                piece = torch.zeros(mp, r_hi - r_lo, dtype=torch.int8)
                piece[:m] = part[:, r_lo:r_hi]
                blocks.append(piece.view(mp // LORA_BLOCK, LORA_BLOCK, -1).transpose(1, 2).contiguous().flatten())
                seg += [o_lo, m, r_lo, r_hi - r_lo, off]
                off += blocks[-1].numel()
            o_lo += m
        bt = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.int8)
        return cls(at, sap, bt, sb.contiguous(), torch.tensor(seg, dtype=torch.long))


def lora_rows(lib, h: torch.Tensor, rows: torch.Tensor, w: LoraWeights, y: torch.Tensor) -> torch.Tensor:
    """y[g] += B (A h[g]) for g in rows (int64, at most MAX_C_ROWS), in place: see kernels.c. h (n, k) and y
    (n, m) float32 with contiguous rows; returns y."""
    check_tensor("h", h, torch.float32, (None, None), rows=True)
    if h.shape[1] != w.c.k:
        raise ValueError(f"the delta's rows have {h.shape[1]} values, its A takes {w.c.k}")
    check_tensor("y", y, torch.float32, (h.shape[0], None), rows=True)
    if w.m > y.shape[1]:
        raise ValueError(f"the delta writes {w.m} outputs, y has {y.shape[1]}")
    check_row_indices(rows, h.shape[0])
    lib.mars_lora_rows(h.data_ptr(), h.stride(0), rows.data_ptr(), rows.numel(), ctypes.byref(w.c), y.data_ptr(),
                       y.stride(0))
    return y


def _logit_rows(logits: torch.Tensor):
    """(library, leading shape, rows (n, V) with contiguous rows) for the scoring kernels, or None where they do
    not run (no kernels, not a CPU float32 tensor, empty): the caller then uses tensor ops."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.numel() == 0:
        return None
    lib = kernels()
    if lib is None:
        return None
    x = logits.reshape(-1, logits.shape[-1])
    return lib, logits.shape[:-1], x if x.stride(-1) == 1 else x.contiguous()


def argmax_conf(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tokens, p(token)) of greedy choice over the last dimension, by `mars_argmax_conf` (one pass to find
    the maximum, one to sum the exponentials; torch's log_softmax, exp, argmax and gather took 7x the time on
    8 rows of a 49k vocabulary); None where it does not run (`_logit_rows`)."""
    got = _logit_rows(logits)
    if got is None:
        return None
    lib, lead, x = got
    n, V = x.shape
    tok, conf = torch.empty(n, dtype=torch.long), torch.empty(n)
    lib.mars_argmax_conf(x.data_ptr(), n, V, x.stride(0), tok.data_ptr(), conf.data_ptr())
    return tok.view(lead), conf.view(lead)


def top_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(probabilities, tokens) of the k likeliest tokens over the last dimension, descending, by `mars_top_probs`
    (one pass instead of softmax then topk: 5x less time on 8 rows of 49k logits); None where it does not run."""
    got = _logit_rows(logits) if 0 < k <= logits.shape[-1] else None
    if got is None:
        return None
    lib, lead, x = got
    n, V = x.shape
    idx, prob = torch.empty(n, k, dtype=torch.long), torch.empty(n, k)
    lib.mars_top_probs(x.data_ptr(), n, V, x.stride(0), k, idx.data_ptr(), prob.data_ptr())
    return prob.view(*lead, k), idx.view(*lead, k)
