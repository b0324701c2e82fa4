"""llama.cpp's own server (`llama-server`) as the serving benchmark's peer: built here, started on loopback, streamed.

The bench's in-process peer (mars.evaluation.llamacpp) decodes one sequence at a time; a serving benchmark needs
what llama.cpp offers many clients at once: its HTTP server, which batches the running requests of its `-np`
slots into one pass (continuous batching). This module builds that binary from the very llama.cpp source the
binding vendors (llama-cpp-python 0.3.36's sdist, as docs/peers.md uses), starts it on the default model's GGUF
with the core's thread count, and streams one greedy chat answer from it, timed, with the standard library only
(no client package to install beside the app).

The build targets this CPU's instruction set through explicit flags, not GGML_NATIVE: `-march=native` also turns
on AMX where the CPU lists it, and such a build died with an illegal instruction on an AMX machine. The flags are
a pure function of the CPU's flag set (`cmake_flags`), so tests check the choice for CPUs this machine is not.

Loopback only: the server listens on 127.0.0.1 and `stream_chat` refuses any other host, so nothing here talks
to, or is reachable from, another machine. `python -m mars.evaluation.llama_server DEST` builds into DEST and
prints the binary's path (docs/peers.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's, as docs/peers.md installs: the same llama.cpp as the in-process peer
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
VENDORED = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"  # the llama.cpp tree inside the sdist
BINARY = Path("build") / "bin" / "llama-server"  # under dest: where CMake puts its executables
INSTALL_HINT = "apt-get install -y cmake g++"

# (CMake option, the /proc/cpuinfo flags it needs). Every option is passed ON or OFF: with GGML_NATIVE off,
# ggml turns SSE4.2, AVX, AVX2, BMI2, FMA and F16C on by default, which a CPU without them could not run.
ISA = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    # GGML_AVX512 compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw: it needs all five
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
)
AVX512_VNNI = ("GGML_AVX512_VNNI", ("avx512_vnni",))  # only on top of GGML_AVX512 (its kernels assume it)

# Always off: AMX (the illegal instruction above; the core's AMX path is its own), the AVX-512 extensions the
# Q4_1 kernels do not use, and everything a benchmark peer does not need: downloads (curl, HTTPS, the web UI's
# prebuilt assets from Hugging Face, npm), tests, examples. A static binary, so it runs from wherever it lies.
FIXED = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
    "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_BF16=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
]

LOOPBACK = "127.0.0.1"
HEALTH_WAIT_S = 120.0  # loading a 135M-parameter GGUF takes a second or two; a warm-up pass follows


class BuildError(RuntimeError):
    """llama-server could not be built here; the message is one line saying why and what to do."""


class ServerError(RuntimeError):
    """llama-server did not come up, or answered a request with an error; the message is one line."""


def _one_line(text: str, limit: int = 300) -> str:
    """`text` squeezed to one line, at most `limit` characters: errors here are read in a benchmark's log."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------- the build

def cmake_flags(cpu_flags: set[str]) -> list[str]:
    """The CMake options that build llama.cpp for a CPU with these /proc/cpuinfo flags: the fixed ones, then each
    ISA option ON where the CPU has every flag it needs, else OFF."""
    flags = set(cpu_flags)
    out = list(FIXED)
    on = {}
    for option, needs in ISA:
        on[option] = all(f in flags for f in needs)
    name, needs = AVX512_VNNI
    on[name] = on["GGML_AVX512"] and all(f in flags for f in needs)
    out += [f"-D{option}={'ON' if value else 'OFF'}" for option, value in on.items()]
    return out


def _this_cpu() -> set[str]:
    """This CPU's flags (mars.runtime.cpu, so MARS_CPU_FLAGS builds for the smaller CPU it names too)."""
    from mars.runtime.cpu import cpu_flags

    flags = cpu_flags()
    if flags is None:
        raise BuildError("llama-server: cannot build: no /proc/cpuinfo to choose the instruction set from "
                         "(set MARS_CPU_FLAGS)")
    return flags


def _check_tools() -> None:
    """CMake and a C++ compiler, or a one-line error saying how to get them."""
    if shutil.which("cmake") is None:
        raise BuildError(f"llama-server: cannot build: cmake is not installed ({INSTALL_HINT})")
    if not any(shutil.which(cxx) for cxx in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        raise BuildError(f"llama-server: cannot build: no C++ compiler (c++, g++ or clang++) ({INSTALL_HINT})")


def _sdist(folder: Path) -> Path:
    """llama-cpp-python's sdist in `folder`, downloaded there by pip when it is not there yet."""
    path = folder / SDIST
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={VERSION}", "-d", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_nice)
    if done.returncode != 0 or not path.is_file():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BuildError(_one_line(f"llama-server: cannot build: no {SDIST} in {folder} and pip could not "
                                   f"download it: {last[0]}"))
    return path


def _extract(sdist: Path, src: Path) -> Path:
    """The vendored llama.cpp tree of the sdist, unpacked into `src` once (a CMakeLists.txt there: done)."""
    if (src / "CMakeLists.txt").is_file():
        return src
    part = src.with_name(src.name + ".part")  # unpack aside, then rename: an interrupted unpack is not reused
    shutil.rmtree(part, ignore_errors=True)
    try:
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                rel = m.name[len(VENDORED):]
                # its .git points into llama-cpp-python's repository, which is not here: leave it out
                if m.name.startswith(VENDORED) and rel and rel.split("/")[0] != ".git":
                    m.name = rel
                    members.append(m)
            if not members:
                raise BuildError(f"llama-server: cannot build: {sdist} has no {VENDORED} folder")
            tar.extractall(part, members=members, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise BuildError(_one_line(f"llama-server: cannot build: could not unpack {sdist}: {e}")) from e
    shutil.rmtree(src, ignore_errors=True)
    part.rename(src)
    return src


def _nice() -> None:
    """Run at the lowest priority: the machine's two cores are shared, and a build must not slow anyone's run."""
    os.nice(19)


def _run_logged(cmd: list[str], log: Path, env: dict | None) -> None:
    """One build step, its output appended to `log`; a failure is one line naming the step and the log."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=_nice)
    if done.returncode != 0:
        raise BuildError(f"llama-server: build failed: `{cmd[0]} {cmd[1]}` exited {done.returncode}; see {log}")


def build(dest: Path, sdist: Path | None = None, cpu_flags: set[str] | None = None) -> Path:
    """The path of `llama-server` built in `dest` (dest/build/bin/llama-server), building it first where it is not
    there: llama-cpp-python's sdist (`sdist`, else dest/sdist/, downloaded by pip), its vendored llama.cpp unpacked
    into dest/src, CMake with `cmake_flags(cpu_flags)` (default: this CPU's), the one target, two jobs, under nice.
    dest/build.log holds the build's output; dest/build.json the flags and seconds it took. BuildError (one line)
    when it cannot build."""
    dest = Path(dest).expanduser().resolve()
    binary = dest / BINARY
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary  # built before: a rebuild takes many minutes of both cores
    _check_tools()
    flags = cmake_flags(_this_cpu() if cpu_flags is None else cpu_flags)
    dest.mkdir(parents=True, exist_ok=True)
    archive = Path(sdist) if sdist else _sdist(dest / "sdist")
    t0 = time.perf_counter()  # the build's time, from unpacking on (not the download)
    src = _extract(archive, dest / "src")
    log = dest / "build.log"
    log.write_text("")
    env = None  # the caller's environment, as it is
    _run_logged(["cmake", "-S", str(src), "-B", str(dest / "build"), *flags], log, env)
    t1 = time.perf_counter()
    # two jobs: the machine has two cores
    _run_logged(["cmake", "--build", str(dest / "build"), "--target", "llama-server", "--parallel", "2"], log, env)
    if not binary.is_file():
        raise BuildError(f"llama-server: build finished but {binary} is missing; see {log}")
    t2 = time.perf_counter()
    info = {"version": VERSION, "flags": flags, "configure_s": round(t1 - t0, 1), "compile_s": round(t2 - t1, 1),
            "seconds": round(t2 - t0, 1), "binary": str(binary)}
    (dest / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    return binary


# ------------------------------------------------------------------------------------------------ the server

def _free_port() -> int:
    """A loopback port nobody listens on now (as mars.app.serving.free_port; the bench does not import the app)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _opener() -> urllib.request.OpenerDirector:
    """urllib without proxies: an http_proxy in the environment would otherwise carry loopback requests away."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def check_loopback(url: str) -> str:
    """`url` with no trailing slash when it is http:// on a loopback host (127.0.0.0/8, ::1, localhost); else
    ValueError: this module talks to a server it started on this machine, never to another one."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: not resolved, refused
        loopback = False
    if parts.scheme != "http" or not loopback:
        raise ValueError(f"llama-server: refusing {url!r}: only http:// on a loopback host (127.0.0.1)")
    return url.rstrip("/")


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


def start(binary: Path, gguf: Path, slots: int, threads: int = 2, ctx_per_slot: int = 2048,
          port: int | None = None, wait_s: float = HEALTH_WAIT_S) -> tuple[subprocess.Popen, str]:
    """llama-server on `gguf` with `slots` slots (-np) of `ctx_per_slot` tokens each and `threads` threads, on
    127.0.0.1 (`port`, else a free one); returns (process, url) once /health answers ok, within `wait_s` seconds.
    Its output goes to a temporary file, `proc.log_path`. ServerError (one line) when it exits or stays unready."""
    port = _free_port() if port is None else port
    cmd = [
        str(binary), "-m", str(gguf), "--host", LOOPBACK, "--port", str(port),
        "-np", str(slots), "-cb",  # continuous batching: the running slots' tokens share one pass
        "-c", str(slots * ctx_per_slot), "--no-kv-unified",  # -c is split evenly: each slot gets ctx_per_slot
        "-t", str(threads), "-tb", str(threads),  # the core's thread count, for generation and prompts
        # every request starts from an empty cache, as the core's runs and the in-process peer's do
        "--no-cache-prompt", "--cache-ram", "0",
        "--no-webui",
    ]
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    proc.log_path = log
    url = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(_one_line(f"llama-server exited {proc.returncode} before it was ready: "
                                        f"{_last_line(log)} (log: {log})"))
        if _healthy(url):
            return proc, url
        time.sleep(0.1)
    stop(proc)
    raise ServerError(f"llama-server was not ready within {wait_s:.0f} s (log: {log})")


def _healthy(url: str) -> bool:
    """/health answers 200 {"status": "ok"} once the model is loaded (503 while it loads)."""
    try:
        with _opener().open(url + "/health", timeout=2) as r:
            return r.status == 200 and json.loads(r.read() or b"{}").get("status") == "ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop(proc: subprocess.Popen, wait_s: float = 10.0) -> None:
    """End the server: SIGTERM (it finishes cleanly), SIGKILL if it has not exited within `wait_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------------- the request

def request_body(prompt: str, max_tokens: int) -> dict:
    """One greedy streamed chat request: the GGUF's own chat template on one user message, temperature 0 and
    top-k 1 (llama.cpp's greedy sampler), no penalties, the usage chunk at the end, no prompt cache."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
        "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
        "cache_prompt": False,
        "seed": 0,
    }


def _events(resp):
    """The JSON objects of a server-sent-event stream, up to its `data: [DONE]`."""
    for raw in resp:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def stream_chat(url: str, prompt: str, max_tokens: int, timeout: float = 120.0) -> dict:
    """One greedy streamed answer from llama-server at `url` (loopback only), timed from sending the request:

    first_token_s (to the first content token), total_s (to the end of the stream), text, tokens (generated:
    the final usage chunk's completion_tokens, else the content chunks counted; `tokens_from` says which),
    finish_reason. ServerError (one line) on an HTTP error or an error event; TimeoutError past `timeout`."""
    url = check_loopback(url)
    body = json.dumps(request_body(prompt, max_tokens)).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    pieces: list[str] = []
    first = None
    usage = None
    finish = None
    t0 = time.perf_counter()
    try:
        with _opener().open(req, timeout=timeout) as resp:
            for event in _events(resp):
                if "error" in event:
                    raise ServerError(_one_line(f"llama-server: {event['error']}"))
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        first = time.perf_counter() - t0 if first is None else first
                        pieces.append(content)
                    finish = choice.get("finish_reason") or finish
                usage = event.get("usage") or usage
                if time.perf_counter() - t0 > timeout:
                    raise TimeoutError(f"llama-server: no whole answer within {timeout:.0f} s")
    except urllib.error.HTTPError as e:
        raise ServerError(_one_line(f"llama-server: HTTP {e.code}: {e.read()[:300]!r}")) from e
    total = time.perf_counter() - t0
    counted = usage is not None and "completion_tokens" in usage
    return {
        "first_token_s": first,  # None when the answer had no content (an immediate EOS)
        "total_s": total,
        "text": "".join(pieces),
        "tokens": int(usage["completion_tokens"]) if counted else len(pieces),
        "tokens_from": "usage" if counted else "chunks",
        "finish_reason": finish,
    }


if __name__ == "__main__":  # python -m mars.evaluation.llama_server DEST: build (or find) the binary, print its path
    if len(sys.argv) != 2:
        sys.exit("usage: python -m mars.evaluation.llama_server DEST")
    try:
        print(build(Path(sys.argv[1])))
    except BuildError as e:
        sys.exit(str(e))
