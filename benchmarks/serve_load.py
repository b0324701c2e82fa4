"""A room of clients against the real server, batching on and off in one run, and llama.cpp's server beside it
(issue 53, item 7).

    python -m benchmarks.serve_load                         # N = 1 2 4 8 16 32, 96-token lossless answers
    python -m benchmarks.serve_load --clients 1 4 16 --max-new-tokens 64 --json out.json
    python -m benchmarks.serve_load --llama-server /work/llama-build   # the peer, built there if need be

For each setting (MARS_BATCHING=1, then 0) it starts `python app.py` (the real Gradio queue, the default model,
int8, MARS_THREADS=2), and for each N starts N clients of the public API at once, each streaming one
`/generate_verified` answer (the page's lossless setting, its default: issue 53 item 8) of a different held-out
prompt (data/prompts/heldout.jsonl); `--page` more clients go through the page's own Generate event (its race
beside it). Printed for each N: aggregate tokens/s (every answer's tokens over the wall time from the first
request to the last answer), p50 / p95 time to the first streamed group, p95 whole answer, errors, and how many
texts equal their solo text (the same prompt alone on the one-pass-at-a-time server: verified decoding is this
int8 model's greedy text, whoever shares its passes). The server's RSS after each N.

The peer: llama-server (continuous batching, N slots, -t 2, the same GGUF: mars.evaluation.llama_server), the
same prompts through its chat template, greedy, streamed, at the same N; where it cannot be built or started,
one line says so and the rest runs. Loopback only, every request bounded in time.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from tools.load_test import percentile, rss_mb, start_server

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "data" / "prompts" / "heldout.jsonl"
REQUEST_TIMEOUT_S = 600.0


def heldout_prompts(n: int) -> list[str]:
    from mars.evaluation.bench import read_prompts

    prompts = read_prompts(HELDOUT)
    return [prompts[i % len(prompts)] for i in range(n)]


def rounds(n: int) -> int:
    """Answers each of n clients asks, one after the other: 8 in all at least, so that a small room's figure is
    over more than one short answer."""
    return max(1, -(-8 // n))


def room_prompts(n: int, k: int) -> list[list[str]]:
    """Client i's k prompts: held-out prompts i, i + n, i + 2n, ... (every answer of a room a different prompt)."""
    everyone = heldout_prompts(n * k)
    return [[everyone[i + j * n] for j in range(k)] for i in range(n)]


def _stream_api(url: str, prompt: str, max_new: int) -> dict:
    """One client: one streamed /generate_verified answer at the page's setting, through Gradio's own REST route
    (POST .../call/generate_verified, then its event stream), on the standard library: a client as light as
    the peer's (mars.evaluation.llama_server.stream_chat), so that the clients' own work on these two cores
    weighs the same on both servers."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    t0 = time.perf_counter()
    body = json.dumps({"data": [prompt, None, max_new, 0.0, None]}).encode()
    req = urllib.request.Request(f"{url}gradio_api/call/generate_verified", data=body,
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=60) as resp:
        event_id = json.loads(resp.read())["event_id"]
    first, event, final = None, None, None
    with opener.open(f"{url}gradio_api/call/generate_verified/{event_id}", timeout=REQUEST_TIMEOUT_S) as resp:
        for raw in resp:
            line = raw.decode("utf-8").rstrip("\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:].strip() or "null")
                if event == "generating" and first is None and data and data[0]:
                    first = time.perf_counter() - t0
                elif event == "complete":
                    final = data
                    break
                elif event == "error":
                    raise RuntimeError(f"the server said: {str(data)[:200]}")
    if final is None:
        raise RuntimeError("the stream ended without an answer")
    text, trace = final
    end = time.perf_counter()
    return {"first_s": first if first is not None else end - t0, "total_s": end - t0, "text": text,
            "tokens": trace["tokens"], "start": t0, "end": end, "passes": trace.get("passes")}


def _stream_page(url: str, prompt: str, max_new: int) -> dict:
    """One visitor through the page's own Generate event (the browser's protocol: join the queue, read its
    stream), at the page's own settings, its AR race beside it: its times (its rows' tokens are not counted in
    the aggregate, which is the API clients')."""
    import httpx

    cfg = httpx.get(f"{url}config", timeout=30).json()
    dep = next(d for d in cfg["dependencies"] if d.get("api_name") == "ui_generate")
    session = f"bench-{threading.get_ident()}-{time.perf_counter_ns()}"
    comps = {c["id"]: c for c in cfg["components"]}
    data = []
    for cid in dep["inputs"]:  # the Generate event's inputs at the page's own values, the prompt ours
        c = comps[cid]
        elem = (c.get("props") or {}).get("elem_id")
        value = (c.get("props") or {}).get("value")
        data.append(prompt if elem == "prompt" else value)
    body = {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None,
            "trigger_id": dep["targets"][0][0]}
    t0 = time.perf_counter()
    assert httpx.post(f"{url}gradio_api/queue/join", json=body, timeout=30).status_code == 200
    first = None
    done = False
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session},
                      timeout=REQUEST_TIMEOUT_S) as resp:
        for line in resp.iter_lines():
            if '"process_generating"' in line and first is None and "mars-group" in line:
                first = time.perf_counter() - t0
            if '"process_completed"' in line:
                done = '"success": true' in line or '"success":true' in line
                break
    end = time.perf_counter()
    return {"first_s": first, "total_s": end - t0, "ok": done, "start": t0, "end": end}


def run_room(url: str, prompts: list[list[str]], max_new: int, page: int) -> dict:
    """len(prompts) API clients at once, client i asking prompts[i] one after the other, and `page` page visitors
    beside them; their figures."""
    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(fn, mine):
        for prompt in mine:
            try:
                r = fn(url, prompt, max_new)
                with lock:
                    results.append(r | {"kind": fn.__name__, "prompt": prompt})
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    errors.append(f"{type(e).__name__}: {str(e)[:200]}")

    jobs = [(_stream_api, p) for p in prompts] + [(_stream_page, prompts[i % len(prompts)][:1]) for i in range(page)]
    threads = [threading.Thread(target=one, args=j, daemon=True) for j in jobs]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=REQUEST_TIMEOUT_S + 60)
    # the room's wall time: from the first request sent to the last answer in (the clients' own set-up apart)
    wall = (max(r["end"] for r in results) - min(r["start"] for r in results)) if results else \
        time.perf_counter() - t0
    api = [r for r in results if r["kind"] == "_stream_api"]
    tokens = sum(r["tokens"] for r in api)
    firsts = [r["first_s"] for r in results if r["first_s"] is not None]
    return {"clients": len(prompts), "requests": len(api), "page": page, "wall_s": wall, "tokens": tokens,
            "tokens_per_s": tokens / wall if wall else None,
            "first_p50_s": percentile(firsts, 0.5), "first_p95_s": percentile(firsts, 0.95),
            "total_p95_s": percentile([r["total_s"] for r in results], 0.95),
            "errors": len(errors) + sum(1 for r in results if r.get("ok") is False), "error_messages": errors[:3],
            "texts": {r["prompt"]: r["text"] for r in api}}


def serve_rooms(batching: bool, counts: list[int], max_new: int, page: int, start_timeout: float,
                solo_prompts: list[str] | None = None) -> tuple[dict, dict | None]:
    """One server (batching on or off): every room; and, where asked, each prompt's solo text (one at a time)."""
    import os

    os.environ["MARS_BATCHING"] = "1" if batching else "0"
    os.environ.setdefault("MARS_THREADS", "2")
    log = Path(f"/tmp/mars-serve-load-{'on' if batching else 'off'}.log")
    proc, url = start_server(log, start_timeout)
    try:
        _stream_api(url, "Hello!", 8)  # waits for the model, its warm-up and rehearsal
        solo = None
        if solo_prompts is not None:
            solo = {p: _stream_api(url, p, max_new)["text"] for p in solo_prompts}
        rooms = {}
        for n in counts:
            room = run_room(url, room_prompts(n, rounds(n)), max_new, page if n > 1 else 0)
            room["rss_mb"] = rss_mb(proc.pid)
            rooms[n] = room
            print(f"  batching {'on ' if batching else 'off'} N={n:>2}: {fmt(room['tokens_per_s'])} tokens/s, first group "
                  f"p50 {fmt(room['first_p50_s'])} s p95 {fmt(room['first_p95_s'])} s, whole p95 "
                  f"{fmt(room['total_p95_s'])} s, errors {room['errors']}, RSS {fmt(room['rss_mb'])} MB", flush=True)
        return rooms, solo
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def peer_rooms(where: Path, counts: list[int], max_new: int) -> dict | str:
    """llama-server at each N (N slots), the same prompts; or the one line saying why it did not run."""
    from mars.evaluation import llama_server
    from mars.models.loading import locate_default_gguf

    try:
        binary = llama_server.build(where)
        gguf = locate_default_gguf()
    except Exception as e:  # noqa: BLE001 - the peer is optional: one line, the rest stands
        return f"llama-server: not run: {e}"
    rooms = {}
    for n in counts:
        try:
            proc, url = llama_server.start(binary, gguf, slots=max(n, 1), threads=2, ctx_per_slot=1024)
        except Exception as e:  # noqa: BLE001
            return f"llama-server: not run at N={n}: {e}"
        try:
            llama_server.stream_chat(url, "Hello!", 8)
            results, errors, lock = [], [], threading.Lock()

            def one(prompt):
                try:
                    start = time.perf_counter()
                    r = llama_server.stream_chat(url, prompt, max_new, timeout=REQUEST_TIMEOUT_S)
                    with lock:
                        results.append(r | {"start": start, "end": time.perf_counter()})
                except Exception as e:  # noqa: BLE001
                    with lock:
                        errors.append(str(e)[:200])

            def client(mine):
                for p in mine:
                    one(p)

            threads = [threading.Thread(target=client, args=(m,), daemon=True) for m in room_prompts(n, rounds(n))]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=REQUEST_TIMEOUT_S + 60)
            wall = time.perf_counter() - t0
            wall = max(r["end"] for r in results) - min(r["start"] for r in results) if results else wall
            tokens = sum(r["tokens"] for r in results)
            firsts = [r["first_token_s"] for r in results if r["first_token_s"] is not None]
            rooms[n] = {"tokens_per_s": tokens / wall, "first_p50_s": percentile(firsts, 0.5),
                        "first_p95_s": percentile(firsts, 0.95),
                        "total_p95_s": percentile([r["total_s"] for r in results], 0.95), "errors": len(errors)}
            print(f"  llama-server N={n:>2}: {fmt(rooms[n]['tokens_per_s'])} tokens/s, first token p50 "
                  f"{fmt(rooms[n]['first_p50_s'])} s p95 {fmt(rooms[n]['first_p95_s'])} s", flush=True)
        finally:
            llama_server.stop(proc)
    return rooms


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def table(on: dict, off: dict, solo: dict, peer: dict | str | None) -> str:
    head = ("| clients | batching on: tokens/s | first group p50 / p95 | whole p95 | errors | same as solo | "
            "off: tokens/s | first p50 / p95 | on / off |" + (" llama-server tokens/s | first p50 / p95 |"
                                                               if isinstance(peer, dict) else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for n in on:
        a, b = on[n], off.get(n, {})
        same = sum(solo.get(p) == t for p, t in a["texts"].items())
        same_off = sum(solo.get(p) == t for p, t in b.get("texts", {}).items())
        ratio = a["tokens_per_s"] / b["tokens_per_s"] if b.get("tokens_per_s") else None
        row = (f"| {n}{' + ' + str(a['page']) + ' page' if a['page'] else ''} | {fmt(a['tokens_per_s'])} | "
               f"{fmt(a['first_p50_s'])} / {fmt(a['first_p95_s'])} s | {fmt(a['total_p95_s'])} s | {a['errors']} | "
               f"{same}/{len(a['texts'])} (off {same_off}/{len(b.get('texts', {}))}) | {fmt(b.get('tokens_per_s'))} | "
               f"{fmt(b.get('first_p50_s'))} / {fmt(b.get('first_p95_s'))} s | {fmt(ratio)}x |")
        if isinstance(peer, dict):
            p = peer.get(n, {})
            row += f" {fmt(p.get('tokens_per_s'))} | {fmt(p.get('first_p50_s'))} / {fmt(p.get('first_p95_s'))} s |"
        lines.append(row)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--page", type=int, default=2, help="page visitors beside the API clients at each N > 1")
    ap.add_argument("--llama-server", default=None, help="a folder to build (or find) llama-server in")
    ap.add_argument("--no-off", action="store_true", help="batching on only (no baseline, no solo texts)")
    ap.add_argument("--start-timeout", type=float, default=400)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if any(not 1 <= n <= 64 for n in args.clients):
        ap.error("--clients must be in [1, 64]")
    import platform

    print(f"serve_load: N = {args.clients}, {args.max_new_tokens}-token /generate_verified answers at the page's "
          f"setting, {args.page} page visitors beside them; {platform.processor() or platform.machine()}", flush=True)
    everyone = sorted({p for n in args.clients for mine in room_prompts(n, rounds(n)) for p in mine})
    off, solo = ({}, {}) if args.no_off else serve_rooms(False, args.clients, args.max_new_tokens, args.page,
                                                           args.start_timeout, solo_prompts=everyone)
    on, _ = serve_rooms(True, args.clients, args.max_new_tokens, args.page, args.start_timeout)
    peer = peer_rooms(Path(args.llama_server), args.clients, args.max_new_tokens) if args.llama_server else None
    if isinstance(peer, str):
        print(peer)
    print(table(on, off, solo or {}, peer))
    if args.json:
        Path(args.json).write_text(json.dumps({"on": on, "off": off, "solo": solo, "peer": peer,
                                               "max_new_tokens": args.max_new_tokens}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
