"""Load test: several concurrent API clients against the app on this machine, bounded in requests and time.

    python -m tools.load_test                               # starts `python app.py` (MARS_MODEL or the default)
    python -m tools.load_test --clients 6 --requests 12 --max-new-tokens 32
    python -m tools.load_test --url http://127.0.0.1:7860/ --pid 1234   # a server already running here

Loopback only: the script refuses any other host. Each client is its own gradio_client.Client calling the
public `/generate` endpoint with the app's example prompts. One warm-up request (it loads the model) is not
counted. Prints latency p50/p95/max, errors, generated tokens and throughput, and the server's RSS after
the warm-up and after the run; `--json` writes the same figures to a file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least q of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def start_server(log_path: Path, wait_s: float) -> tuple[subprocess.Popen, str]:
    from mars import settings
    from mars.app.serving import free_port

    port = free_port()
    # the server's own settings are this environment's, but one torch thread per pass unless MARS_THREADS says
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
               GRADIO_ANALYTICS_ENABLED="False", MARS_THREADS=str(settings.get().threads or 1))
    log = log_path.open("wb")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"the server did not answer within {wait_s:.0f} s")


def prompts() -> list[str]:
    return [e["prompt"] for e in json.loads((ROOT / "assets" / "examples.json").read_text())]


def run_load(url: str, clients: int, requests: int, tau: float, block: int, max_new: int, deadline: float) -> dict:
    """`requests` calls shared by `clients` threads; none starts after `deadline` (time.time())."""
    from gradio_client import Client

    texts = prompts()
    lock = threading.Lock()
    next_index = [0]
    latencies: list[float] = []
    errors: list[str] = []
    tokens = [0]
    skipped = [0]

    def take() -> int | None:
        with lock:
            if next_index[0] >= requests:
                return None
            if time.time() > deadline:
                skipped[0] += 1
                next_index[0] += 1
                return -1
            next_index[0] += 1
            return next_index[0] - 1

    def client_loop():
        try:
            client = Client(url, verbose=False)
        except Exception as e:  # noqa: BLE001 - reported as an error of every request it would have made
            with lock:
                errors.append(f"client: {type(e).__name__}: {e}")
            return
        while (i := take()) is not None:
            if i < 0:
                continue
            t0 = time.perf_counter()
            try:
                _, trace = client.predict(texts[i % len(texts)], tau, block, max_new, api_name="/generate")
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    tokens[0] += trace["tokens"]
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(f"{type(e).__name__}: {str(e)[:200]}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.time() + 600))  # a request already running may finish
    wall = time.perf_counter() - t0
    return {
        "requests": requests, "completed": len(latencies), "errors": len(errors), "error_messages": errors[:5],
        "skipped_at_deadline": skipped[0], "wall_s": wall,
        "latency_p50_s": percentile(latencies, 0.5), "latency_p95_s": percentile(latencies, 0.95),
        "latency_max_s": max(latencies) if latencies else None,
        "tokens": tokens[0], "tokens_per_s": tokens[0] / wall if wall > 0 else None,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a server already running on this machine (default: start one)")
    ap.add_argument("--pid", type=int, default=None, help="with --url: the server's process id, for its RSS")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--requests", type=int, default=12, help="in all, shared by the clients (at most 1000)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--tau", type=float, default=0.9)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=600, help="no request starts after this many seconds")
    ap.add_argument("--start-timeout", type=float, default=300, help="seconds to wait for the server and model")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if not 1 <= args.clients <= 64 or not 1 <= args.requests <= 1000:
        ap.error("--clients must be in [1, 64] and --requests in [1, 1000]")

    proc = None
    log = Path(tempfile.mkdtemp(prefix="mars-load-")) / "server.log"
    if args.url:
        host = urllib.parse.urlparse(args.url).hostname
        if host not in LOOPBACK:
            ap.error(f"--url must be on this machine ({', '.join(sorted(LOOPBACK))}), got {host!r}")
        url, pid = args.url, args.pid
    else:
        proc, url = start_server(log, args.start_timeout)
        pid = proc.pid
    try:
        from gradio_client import Client

        t0 = time.perf_counter()
        Client(url, verbose=False).predict("Hello!", args.tau, args.block_size, 8, api_name="/generate")
        warm = time.perf_counter() - t0
        before = rss_mb(pid) if pid else None
        deadline = time.time() + args.time_limit
        report = run_load(url, args.clients, args.requests, args.tau, args.block_size, args.max_new_tokens, deadline)
        after = rss_mb(pid) if pid else None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    from mars import settings

    report |= {"model": settings.get().model or "default (smollm2)", "clients": args.clients,
               "max_new_tokens": args.max_new_tokens, "tau": args.tau, "block_size": args.block_size,
               "warm_up_s": warm, "server_rss_before_mb": before, "server_rss_after_mb": after,
               "concurrency_limit": settings.get().concurrency if proc else None}

    def fmt(v, unit=""):
        return "n/a" if v is None else (f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}{unit}")

    print(f"model {report['model']}; {args.clients} clients x {args.requests} requests in all, "
          f"max_new_tokens {args.max_new_tokens}, tau {args.tau}, B {args.block_size}")
    print(f"completed {report['completed']}/{args.requests}, errors {report['errors']}, "
          f"skipped at the time limit {report['skipped_at_deadline']}, wall {fmt(report['wall_s'], ' s')} "
          f"(warm-up request {fmt(warm, ' s')})")
    print(f"latency p50 {fmt(report['latency_p50_s'], ' s')}, p95 {fmt(report['latency_p95_s'], ' s')}, "
          f"max {fmt(report['latency_max_s'], ' s')}; {report['tokens']} tokens, "
          f"{fmt(report['tokens_per_s'], ' tokens/s')} in all")
    print(f"server RSS {fmt(before, ' MB')} after warm-up -> {fmt(after, ' MB')} after the run")
    for message in report["error_messages"]:
        print(f"  error: {message}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
