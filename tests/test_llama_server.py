"""The serving benchmark's peer (mars.evaluation.llama_server): the CMake flags chosen for a CPU's flag set, the
one-line build errors, loopback only, the streamed answer's parsing (against a stand-in server), and one real
answer from a built llama-server where MARS_LLAMA_SERVER names one."""

from __future__ import annotations

import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mars.evaluation import llama_server as ls

AMX_MACHINE = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512cd", "avx512vl",
               "avx512dq", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512vbmi", "amx_tile", "amx_int8",
               "amx_bf16"}
AVX2_ONLY = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}  # a Zen 2 EPYC, a Haswell
AVX512_NO_AVX_VNNI = AVX2_ONLY | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni"}
XEON_PHI = AVX2_ONLY | {"avx512f", "avx512cd", "avx512er", "avx512pf", "avx512_vnni"}  # no BW/DQ/VL
SSE_ONLY = {"sse", "sse2", "ssse3", "sse4_1", "sse4_2"}
ISA_OPTIONS = [name for name, _ in ls.ISA] + ["GGML_AVX512_VNNI"]


def _options(cpu: set[str]) -> dict[str, str]:
    flags = ls.cmake_flags(cpu)
    pairs = [f[2:].split("=", 1) for f in flags]
    assert all(f.startswith("-D") for f in flags) and len({k for k, _ in pairs}) == len(pairs)  # each once
    return dict(pairs)


def _on(cpu: set[str]) -> set[str]:
    opts = _options(cpu)
    assert all(opts[name] in ("ON", "OFF") for name in ISA_OPTIONS)  # every one explicit: the defaults are ON
    return {name for name in ISA_OPTIONS if opts[name] == "ON"}


@pytest.mark.parametrize("cpu, on", [
    (AMX_MACHINE, set(ISA_OPTIONS)),
    (AVX2_ONLY, {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}),
    (AVX2_ONLY | {"avx_vnni"}, {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2",
                                "GGML_AVX_VNNI"}),
    (AVX512_NO_AVX_VNNI, set(ISA_OPTIONS) - {"GGML_AVX_VNNI"}),
    (XEON_PHI, {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}),
    (AVX512_NO_AVX_VNNI - {"avx512_vnni"}, set(ISA_OPTIONS) - {"GGML_AVX_VNNI", "GGML_AVX512_VNNI"}),
    (SSE_ONLY, {"GGML_SSE42"}),
    (set(), set()),
])
def test_the_isa_options_follow_the_cpus_flags(cpu, on):
    assert _on(cpu) == on


@pytest.mark.parametrize("cpu", [AMX_MACHINE, AVX2_ONLY, set()])
def test_never_native_never_amx_no_downloads(cpu):
    opts = _options(cpu)
    assert opts["GGML_NATIVE"] == "OFF"
    assert opts["GGML_AMX_TILE"] == opts["GGML_AMX_INT8"] == opts["GGML_AMX_BF16"] == "OFF"
    assert opts["LLAMA_CURL"] == opts["LLAMA_USE_PREBUILT_UI"] == opts["LLAMA_BUILD_UI"] == "OFF"


def test_the_choice_is_pure():
    cpu = set(AMX_MACHINE)
    assert ls.cmake_flags(cpu) == ls.cmake_flags(frozenset(AMX_MACHINE)) and cpu == AMX_MACHINE


# ----------------------------------------------------------------------------------------------- the build

def test_a_built_binary_is_reused_without_any_tool(tmp_path, monkeypatch):
    binary = tmp_path / ls.BINARY
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(ls.shutil, "which", lambda name: None)  # no cmake, no compiler: not needed
    assert ls.build(tmp_path) == binary


@pytest.mark.parametrize("absent, words", [(lambda name: name == "cmake", "cmake is not installed"),
                                           (lambda name: name.endswith("++"), "no C++ compiler")])
def test_a_missing_tool_is_one_line_saying_how_to_install_it(tmp_path, monkeypatch, absent, words):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(ls.shutil, "which", lambda name: None if absent(name) else f"/usr/bin/{name}")
    with pytest.raises(ls.BuildError) as e:
        ls.build(tmp_path, cpu_flags=AVX2_ONLY)
    assert "\n" not in str(e.value) and words in str(e.value) and ls.INSTALL_HINT in str(e.value)


def test_a_missing_sdist_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(ls.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(ls.BuildError) as e:
        ls.build(tmp_path / "out", sdist=tmp_path / ls.SDIST, cpu_flags=AVX2_ONLY)
    assert "\n" not in str(e.value) and "could not unpack" in str(e.value)


# ------------------------------------------------------------------------------------------ loopback only

@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://example.com", "https://127.0.0.1:8080",
                                 "http://127.0.0.1.example.com:80", "http://0.0.0.0:8080", "ftp://localhost/"])
def test_any_other_host_is_refused_before_a_byte_is_sent(url, monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("opened a connection")

    monkeypatch.setattr(ls, "_opener", no_network)
    with pytest.raises(ValueError, match="only http:// on a loopback host"):
        ls.stream_chat(url, "hi", 4, timeout=1)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/", "http://localhost:1", "http://[::1]:9", "http://127.1.2.3"])
def test_loopback_urls_pass(url):
    assert ls.check_loopback(url) == url.rstrip("/")


# ------------------------------------------------------------------- the stream, against a stand-in server

def _stand_in(chunks: list[dict]):
    """A loopback HTTP server that answers any POST with these chunks as server-sent events, then [DONE]."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in chunks:
                self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", seen


def _delta(text, finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def test_the_answer_is_timed_joined_and_counted_from_the_usage_chunk():
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
              _delta("Hel"), _delta("lo"), _delta("", "stop"),
              {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}]
    server, url, seen = _stand_in(chunks)
    try:
        out = ls.stream_chat(url, "say hello", 8, timeout=10)
    finally:
        server.shutdown()
    assert out["text"] == "Hello" and out["tokens"] == 3 and out["tokens_from"] == "usage"
    assert out["finish_reason"] == "stop" and 0 < out["first_token_s"] <= out["total_s"]
    path, body = seen[0]
    assert path == "/v1/chat/completions" and body["stream"] and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["top_k"], body["repeat_penalty"], body["max_tokens"]) == (0.0, 1, 1.0, 8)
    assert body["messages"] == [{"role": "user", "content": "say hello"}]


def test_without_a_usage_chunk_the_content_chunks_are_counted():
    server, url, _ = _stand_in([_delta("a"), _delta("b"), _delta("c", "length")])
    try:
        out = ls.stream_chat(url, "x", 3, timeout=10)
    finally:
        server.shutdown()
    assert (out["text"], out["tokens"], out["tokens_from"], out["finish_reason"]) == ("abc", 3, "chunks", "length")


def test_an_error_event_is_one_line():
    server, url, _ = _stand_in([{"error": {"code": 400, "message": "the request\nexceeds the context"}}])
    try:
        with pytest.raises(ls.ServerError) as e:
            ls.stream_chat(url, "x", 3, timeout=10)
    finally:
        server.shutdown()
    assert "\n" not in str(e.value) and "exceeds the context" in str(e.value)


# --------------------------------------------------------------------------------------- the real server

NAMED = os.environ.get("MARS_LLAMA_SERVER", "")  # the test's own variable: the library never reads it
BUILT = Path(NAMED) if NAMED else None
ABSENT = (f"no llama-server binary at MARS_LLAMA_SERVER={NAMED!r}" if NAMED else "MARS_LLAMA_SERVER is not set")


@pytest.mark.skipif(BUILT is None or not BUILT.is_file(),
                    reason=f"{ABSENT}: set it to a built binary (python -m mars.evaluation.llama_server DEST prints "
                    "its path; docs/peers.md)")
def test_the_built_server_streams_a_greedy_answer():
    from mars.models.loading import locate_default_gguf

    proc, url = ls.start(BUILT, locate_default_gguf(), slots=2, ctx_per_slot=512)
    try:
        assert url.startswith("http://127.0.0.1:")
        one = ls.stream_chat(url, "Name a colour.", 12, timeout=60)
        two = ls.stream_chat(url, "Name a colour.", 12, timeout=60)
    finally:
        ls.stop(proc)
    assert proc.poll() is not None
    assert one["text"] and one["tokens_from"] == "usage" and 1 <= one["tokens"] <= 12
    assert 0 < one["first_token_s"] <= one["total_s"]
    assert two["text"] == one["text"]  # greedy, and no prompt cache to make the second one differ
