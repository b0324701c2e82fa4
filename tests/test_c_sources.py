"""The C kernels as sources (mars/runtime/csrc/): each file compiles alone with warnings as errors for every ISA
branch it has, the header is the one place the Python side takes its declarations from (its parser is strict,
its structs lay out as the compiler's), every wrapper refuses a tensor that would send a bad pointer over, a
broken build fails loudly (a warning once, the status, the `needs_c` gate), and a sanitizer build runs the
kernel tests clean (slow)."""

import ctypes
import os
import shutil
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from mars.runtime import kernels as ck
from mars.runtime.c_header import HeaderError, parse

ROOT = Path(__file__).resolve().parent.parent
needs_cc = pytest.mark.skipif(ck.skip_reason() is not None, reason=f"no C compiler here: {ck.skip_reason()}")
needs_c = pytest.mark.needs_c  # skips without a compiler, fails on a failed build (conftest.py)

# the branches the sources hold: this CPU's, AVX2, plain C, and AVX-512 VNNI with AMX tiles (compiled, not run)
ISAS = {"native": ["-march=native"], "avx2": ["-mavx2", "-mfma", "-mf16c"], "plain": [],
        "avx512-amx": ["-march=sapphirerapids"]}


def _cc() -> str:
    return ck.compiler()


@needs_cc
@pytest.mark.parametrize("isa", list(ISAS))
def test_each_source_compiles_alone_with_warnings_as_errors(isa, tmp_path):
    if isa == "avx512-amx":
        probe = subprocess.run([_cc(), "-march=sapphirerapids", "-x", "c", "-c", "-", "-o", os.devnull],
                               input="int x;\n", capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip("this compiler does not know -march=sapphirerapids")
    flags = [f for f in ck.compile_flags() if f not in ("-shared", "-march=native")] + ISAS[isa]
    for stages in ([], ["-DMARS_STAGES"]):  # the stage timers' branch too (benchmarks/kernel_ab.py --stages)
        for src in ck.SOURCES:
            done = subprocess.run([_cc(), "-c", "-Wall", "-Werror", "-fopenmp", *flags, *stages,
                                   str(ck.CSRC / src), "-o", str(tmp_path / "x.o")], capture_output=True, text=True)
            assert done.returncode == 0, f"{src} {isa} {stages}: {done.stderr}"


def test_header_gives_the_limits_and_every_prototype():
    assert ck.MAX_C_ROWS == 64 and ck.OUTLIERS == 8 and ck.MAX_LORA_COLUMNS == 256 and ck.LORA_BLOCK == 16 and ck.PAD == 64
    f = ck.HEADER.functions
    assert f["mars_layers"][0] is ctypes.c_int and len(f["mars_layers"][1]) == 22
    assert f["mars_rmsnorm_quant"][1][4] is ctypes.c_float  # eps by value, not a pointer
    assert f["mars_block"] == (ctypes.c_int, []) and f["mars_quant_rows"][0] is None
    assert [n for n, _ in ck.HEADER.structs["layer_c"]._fields_] == ["ln1", "ln2", "eps1", "eps2", "qkv", "o", "gu",
                                                                      "down"]


@pytest.mark.parametrize("text,match", [
    ("#if defined(X)\nint f(void);\n#endif\n", "preprocessor"),
    ("typedef union { int a; } u;\n", "cannot read|not a prototype"),
    ("long f(int a);\n", "return type"),
    ("void f(size_t n);\n", "unknown type"),
    ("typedef struct { lora_w w; } s;\n", "unknown type"),
    ("void f(int a)\n", "cannot read"),
])
def test_header_parser_refuses_what_it_does_not_read(text, match):
    with pytest.raises(HeaderError, match=match):
        parse(text)


@needs_cc
def test_header_structs_lay_out_as_the_compiler_lays_them_out(tmp_path):
    """Each field's offset and each struct's size from ctypes equal C's offsetof and sizeof."""
    lines, want = [], []
    for name, struct in ck.HEADER.structs.items():
        lines.append(f'printf("%zu\\n", sizeof({name}));')
        want.append(ctypes.sizeof(struct))
        for field, _ in struct._fields_:
            lines.append(f'printf("%zu\\n", offsetof({name}, {field}));')
            want.append(getattr(struct, field).offset)
    prog = tmp_path / "layout.c"
    prog.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "mars_kernels.h"\nint main(void) {\n'
                    + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    done = subprocess.run([_cc(), "-I", str(ck.CSRC), str(prog), "-o", str(exe)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    assert got == want


@needs_c
def test_wrappers_refuse_tensors_that_would_corrupt_memory():
    """A wrong dtype is a TypeError, a wrong shape, stride, device or index a ValueError, before any pointer
    crosses over."""
    from mars.runtime.quant import quantize_weight

    lib = ck.kernels()
    x = torch.randn(3, 64)
    with pytest.raises(TypeError, match="x must be torch.float32"):
        ck.quant_rows(lib, x.double())
    with pytest.raises(ValueError, match="contiguous rows"):
        ck.quant_rows(lib, torch.randn(64, 3).t())
    with pytest.raises(ValueError, match="shape"):
        ck.quant_rows(lib, x[None])
    with pytest.raises(ValueError, match="on the CPU"):
        ck.quant_rows(lib, torch.empty(3, 64, device="meta"))
    with pytest.raises(ValueError, match="shorter"):
        ck.quant_rows(lib, x, 32)
    with pytest.raises(ValueError, match=r"w must have shape \(64,\)"):
        ck.rmsnorm_quant(lib, x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="even width"):
        ck.silu_mul_quant(lib, torch.randn(3, 63))
    q, sw = quantize_weight(torch.randn(40, 64))
    blocked, wsum = ck.block_weights(lib, q)
    xq = ck.quant_rows(lib, x, 64)
    y = ck.gemv_rows(lib, xq, blocked, wsum, sw, None)
    assert y.shape == (3, 40)
    with pytest.raises(TypeError, match="xq must be QRows"):
        ck.gemv_rows(lib, xq.q, blocked, wsum, sw, None)
    with pytest.raises(ValueError, match="w must have shape"):
        ck.gemv_rows(lib, xq, blocked[:-1], wsum, sw, None)  # a block of weights short
    with pytest.raises(ValueError, match="multiple of 64"):
        ck.gemv_rows(lib, ck.QRows(xq.q[:, :48].contiguous(), xq.sx, xq.ov, xq.oi), blocked, wsum, sw, None)
    with pytest.raises(TypeError, match="oi must be torch.int32"):
        ck.QRows(xq.q, xq.sx, xq.ov, xq.oi.long())
    with pytest.raises(ValueError, match="ov must have shape"):
        ck.QRows(xq.q, xq.sx, xq.ov[:, :2].contiguous(), xq.oi)
    with pytest.raises(TypeError, match="wsum must be torch.int32"):
        ck.gemv_rows(lib, xq, blocked, wsum.long(), sw, None)
    with pytest.raises(ValueError, match="res must have shape"):
        ck.gemv_rows(lib, xq, blocked, wsum, sw, None, torch.zeros(3, 39))
    with pytest.raises(ValueError, match="bias must have shape"):
        ck.gemv_rows(lib, xq, blocked, wsum, sw, torch.zeros(41))
    with pytest.raises(ValueError, match="out must have shape"):
        ck.gemv_rows(lib, xq, blocked, wsum, sw, None, out=torch.zeros(3, 41))
    from test_cpu_kernels import gated_lora

    a, b = gated_lora(64, [40], [16])
    lw = ck.LoraWeights.of(a, b, [40])
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        ck.gemv_rows(lib, xq, blocked, wsum, sw, None, None, (x, torch.tensor([0, 3]), lw))  # row 3 of 3
    with pytest.raises(TypeError, match="rows must be torch.int64"):
        ck.lora_rows(lib, x, torch.tensor([0], dtype=torch.int32), lw, torch.zeros(3, 40))
    with pytest.raises(ValueError, match="writes 40 outputs"):
        ck.lora_rows(lib, x, torch.tensor([0]), lw, torch.zeros(3, 20))


@needs_c
def test_c_layer_loop_refuses_a_cache_or_mask_that_does_not_fit(tmp_path, tiny_dir):
    from mars.models.loading import load
    from mars.runtime.fastpath import fast_model

    lm = fast_model(load(str(tiny_dir), adapter="none", dtype="float32").model, torch.int8)
    assert lm.c_layers is not None
    cache = lm.new_cache(1, 8)
    x = torch.randn(1, 2, lm.c_layers.D)
    cos = torch.ones(2, lm.head_dim)
    allowed = torch.ones(1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        lm.c_layers.layers(x, cos, cos, cache, 7, torch.ones(1, 2, 9, dtype=torch.uint8), None)  # past capacity
    with pytest.raises(TypeError, match="allowed must be torch.uint8"):
        lm.c_layers.layers(x, cos, cos, cache, 0, allowed.bool(), None)
    with pytest.raises(ValueError, match="x must have shape"):
        lm.c_layers.layers(x[..., :-1], cos, cos, cache, 0, allowed, None)
    with pytest.raises(ValueError, match=r"in \[0, 2\)"):
        lm.c_layers.layers(x, cos, cos, cache, 0, allowed, torch.tensor([2]))
    lm.c_layers.layers(x, cos, cos, cache, 0, allowed, torch.tensor([1]))  # what fits runs


@needs_cc
def test_a_broken_source_fails_the_build_with_the_compilers_error(tmp_path):
    src = tmp_path / "csrc"
    shutil.copytree(ck.CSRC, src)
    with open(src / "layers.c", "a") as f:
        f.write("\nint mars_broken(void) { return ; }\nint mars_worse = ;\n")
    got = ck.build(src, out_dir=tmp_path / "out")
    assert got.lib is None
    assert "layers.c" in got.why and "error" in got.why, got.why
    assert got.status() == f"tensor fallback: {got.why}"
    assert not list((tmp_path / "out").glob("*.so"))  # nothing half-built is left to load


def test_a_failed_build_warns_once_says_so_in_status_and_fails_the_gate(monkeypatch, tmp_path, env):
    """Through kernels(), as the app and the CLI meet it: a compiler that fails (here a script that always
    does) gives one RuntimeWarning with its error, status() 'tensor fallback: ...', and a `needs_c` test
    fails with that message instead of skipping."""
    import conftest

    cc = tmp_path / "failing-cc"
    cc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'failing-cc 1.0'; exit 0; }\n"
                  "echo 'kernels.c:1:1: error: deliberately broken' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setattr(ck, "_STATE", {})
    monkeypatch.setenv("CC", str(cc))
    env.set("MARS_CACHE", str(tmp_path / "cache"))
    env.unset("MARS_C_KERNELS")
    with pytest.warns(RuntimeWarning, match="did not build.*deliberately broken"):
        assert ck.kernels() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning
        assert ck.kernels() is None
        assert ck.status() == "tensor fallback: failing-cc failed: kernels.c:1:1: error: deliberately broken"
    assert ck.skip_reason() is None  # a compiler is here: the tests that need the kernels run, and fail
    item = types.SimpleNamespace(get_closest_marker=lambda name: object() if name == "needs_c" else None)
    with pytest.raises(pytest.fail.Exception, match="did not build: failing-cc failed"):
        conftest.pytest_runtest_setup(item)
    env.set("MARS_C_KERNELS", "0")
    assert ck.status() == "tensor fallback: MARS_C_KERNELS=0"
    with pytest.raises(pytest.skip.Exception, match="MARS_C_KERNELS=0"):
        conftest.pytest_runtest_setup(item)


@needs_c
def test_status_names_the_isa():
    assert ck.status().startswith("C kernels, ")
    assert ck.status().removeprefix("C kernels, ") in {"AMX", *ck.ISA_NAMES.values()}


@pytest.mark.slow
@needs_cc
def test_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    """The library built with -fsanitize=address,undefined (MARS_C_FLAGS, into a fresh cache folder), the kernel
    and layer-loop tests run against it in a Python that preloads ASan's runtime: any out-of-bounds access or
    undefined behaviour aborts the run."""
    asan = subprocess.run([_cc(), "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(asan):
        pytest.skip(f"{_cc()} has no ASan runtime")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARS_CACHE": str(tmp_path / "cache"), "LD_PRELOAD": asan,
           "MARS_C_FLAGS": "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer",
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1",
           "OMP_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
                          "tests/test_cpu_kernels.py", "tests/test_cpu_layers.py",
                          "tests/test_c_sources.py::test_wrappers_refuse_tensors_that_would_corrupt_memory"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = run.stdout[-3000:] + run.stderr[-3000:]
    assert run.returncode == 0, out
    assert "AddressSanitizer" not in out and "runtime error" not in out, out
    assert list((tmp_path / "cache" / "kernels").glob("*.so")), "the sanitizer build was not made"


def test_cli_says_in_one_line_when_int8_falls_back(tiny_dir, monkeypatch, capsys, env):
    from mars import cli

    env.set("MARS_C_KERNELS", "0")
    assert cli.main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--backend", "fast-int8",
                     "--max-new-tokens", "2"]) == 0
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("int8:")]
    assert said == ["int8: tensor fallback: MARS_C_KERNELS=0; about 2x slower than the C kernels"]
    env.unset("MARS_C_KERNELS")
    assert cli.main(["generate", "hi", "--model", str(tiny_dir), "--adapter", "none", "--backend", "hf",
                     "--max-new-tokens", "2"]) == 0
    assert "int8:" not in capsys.readouterr().err  # not an int8 run: nothing to say
