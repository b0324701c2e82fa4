"""The host side of the device step (mars.decoding.device_step): run k steps, read their outputs in ONE copy,
turn them into the decoder's pass records. `decode_steps` hands a run here when cfg.backend is
"static-device".

Per read (every `DecodeConfig.steps_per_read` steps, k = 4 by default), the host:
  1. writes the live tau, if a DecodeControl changed it (a copy to the device, no wait);
  2. replays k steps (the runtime's CUDA graphs on a GPU; eagerly elsewhere): a row that ends inside them
     stops writing;
  3. reads every step's accepted tokens, their confidences, counts and finish flags in one copy; on an
     asynchronous device (the runner's `asynchronous`: CUDA) it queues the next k steps right away, so the
     device runs them while the host does the rest (a tau change or a cancel then lands a read later);
  4. decodes the text, applies stop strings (a row cut there is marked done on the device; what it did in
     the rest of the k steps is dropped) and yields one list of PassRecords per step, as the host loop does.
The first step is the prefill: the whole prompt, at its own width (run eagerly, never captured).

What differs from the host loop, by design: rows never idle at cache-block ends (each row has its own cache
columns, so cache_block does not apply); a pass's `input_len` is the fixed slot width; the tree is the static
one (mars.decoding.static_tree), so its passes differ from the host tree's while its text is the same (AR's).
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from mars.decoding import device_step as ds
from mars.decoding.records import PassRecord
from mars.decoding.rows import RowText, take
from mars.decoding.static_tree import branch, static_tree

REASONS = {ds.EOS: "eos", ds.LENGTH: "length"}


def unsupported(cfg) -> str | None:
    """Why the device step cannot run `cfg`, or None: the DecodeConfig check's words."""
    if cfg.mode not in ("ar", "mars", "verified"):
        return f"mode {cfg.mode!r} (it runs ar, mars and verified)"
    if cfg.temperature > 0:
        return "sampling (temperature > 0): it decodes greedily"
    if cfg.drafts != "mars":
        return f"drafts {cfg.drafts!r} (n-gram lookup runs on the host): use drafts 'mars'"
    if cfg.top_k:
        return "top k candidates (the inspector's): set top k to 0"
    if not cfg.use_cache:
        return "use_cache False (the slow reference path)"
    if cfg.tree_nodes and cfg.block_size < 2:
        return "a tree with block size 1 (no mask to propose its candidates)"
    if cfg.datastore or cfg.pass_costs is not None:
        return "datastore drafts or pass costs (the static tree has one shape)"
    return None


def layouts(cfg, prompt_len: int) -> tuple[ds.Layout, ds.Layout, int]:
    """(the prefill's layout, every later step's, K candidates per depth for a tree)."""
    M = cfg.block_size - 1
    if cfg.mode == "ar":
        return ds.Layout("ar", prompt_len), ds.Layout("ar", 1), 0
    if cfg.mode == "mars":
        G = 1 if M else 0
        return (ds.Layout("mars", prompt_len, G=G, M=M), ds.Layout("mars", cfg.block_size, G=G, M=M), 0)
    if cfg.tree_nodes:
        parents, ranks = static_tree(cfg.tree_nodes, M)
        chain = next((i for i, p in enumerate(parents) if p != i - 1), len(parents))  # the top-1 chain's nodes
        # a group on the root and on every chain node; a path re-feeds its off-chain part, so R = B
        tree = dict(X=len(parents), G=chain + 1, M=M, parents=parents, ranks=ranks)
        return ds.Layout("tree", prompt_len, **tree), ds.Layout("tree", cfg.block_size, **tree), branch(ranks)
    last = cfg.verify_groups == "last"
    G = (1 if last else M + 1) if M else 0
    # after the prefill a verified row re-feeds one token: the AR token at the first mismatch
    return (ds.Layout("chain", prompt_len, X=M, G=G, M=M, last_group=last),
            ds.Layout("chain", 1, X=M, G=G, M=M, last_group=last), 0)


def _out_width(lay: ds.Layout) -> int:
    if lay.kind == "ar":
        return 1
    if lay.kind == "mars":
        return 1 + lay.M
    if lay.kind == "chain":
        return lay.X + 1
    return max(lay.depths, default=0) + 1


def decode_steps_device(lm, prompts: list[list[int]], cfg, control, backend) -> Iterator[list[PassRecord]]:
    """decode_steps for cfg.backend "static-device" (checked and sized by the caller, decode_steps).
    backend: `backend(model, cfg, batch, capacity, scratch) -> runner` with `batch`, `device`, `forward` and
    `run` (mars.runtime.step_runner.StepRunner); None: mars.runtime.backends.make_step_runner.
    Stop strings are cut at each read by the same rule as the host loop's (mars.decoding.rows.take)."""

    tok = lm.tokenizer
    P = max(len(p) for p in prompts)
    first, steady, K = layouts(cfg, P)
    B = cfg.block_size
    capacity = P + cfg.max_new_tokens + 2 * B + 1  # every real column a run may write (drafts past the answer)
    scratch = max(first.W, steady.W)
    if backend is None:
        from mars.runtime.backends import make_step_runner as backend
    runner = backend(lm.model, cfg, len(prompts), capacity, scratch)
    k = cfg.steps_per_read
    O = _out_width(steady)
    Dm = max(1, steady.X) if steady.kind == "chain" else max(steady.M, 1) * max(K, 1)  # never empty: gathers stay simple
    st = ds.new_state(prompts, runner.batch, O, Dm, k, capacity + O + 1, cfg.tau, runner.device)
    temps = ((getattr(lm, "calibration", None) or {}).get("temperatures")) or None
    consts = ds.Consts(
        eos=torch.tensor(sorted(lm.eos_token_ids) or [-1], dtype=torch.long, device=runner.device),
        max_new=cfg.max_new_tokens, mask_id=lm.mask_token_id if lm.mask_token_id is not None else 0,
        measure=cfg.confidence,
        temps=None if not temps else torch.tensor([float(t) for t in temps][:max(B - 1, 1)], dtype=torch.float32,
                                                  device=runner.device),
        repeat_tau=cfg.repeat_tau, max_per_pass=cfg.max_tokens_per_pass, capacity=capacity,
        columns=capacity + scratch)
    # the prefill step fills the ring's slot 0 at its own width; later steps share one fixed shape
    prefill = ds.Step(first, st, consts, runner.forward, K)
    step = ds.Step(steady, st, consts, runner.forward, K)
    key = (steady.kind, runner.batch, steady.W)
    rows = [RowText(i, p) for i, p in enumerate(prompts)]
    source = None if steady.kind in ("ar", "mars") else "mars"
    # an asynchronous device (CUDA) runs the next k steps while the host turns the last k into records
    overlap = bool(getattr(runner, "asynchronous", False))
    state = {"tau": cfg.tau, "started": False}

    def launch() -> bool:
        """Queue k steps (False: cancelled, nothing queued)."""
        if control.cancelled:
            return False
        tau = cfg.tau if control.tau is None else control.tau
        if tau != state["tau"]:
            st.tau.fill_(tau)  # a write to the device: nothing waits
            state["tau"] = tau
        st.t.zero_()
        for _ in range(k):
            if not state["started"]:
                runner.run(None, prefill)  # the prefill: its own width, never captured
                state["started"] = True
            else:
                runner.run(key, step)
        return True

    pass_index = 0
    t0 = time.perf_counter()
    queued = launch()
    while queued and not control.cancelled:
        tau = state["tau"]
        got = _read(st, k)  # THE device read of these k steps
        per_step = (time.perf_counter() - t0) / k
        t0 = time.perf_counter()
        more = any(not got["done"][r.index] for r in rows)
        queued = overlap and more and launch()
        for s in range(k):
            records = []
            for r in rows:
                i = r.index
                if r.finish_reason is not None or not got["live"][s][i]:
                    continue
                records.append(_record(tok, r, got, s, i, cfg, tau, pass_index, steady.W if s or pass_index
                                       else first.W, source, per_step))
                if r.finish_reason == "stop":
                    st.done[i] = True  # the device's row stops writing (a host write, no wait)
            pass_index += 1
            if records:
                yield records
            if all(r.finish_reason is not None for r in rows):
                return
        if not overlap:
            queued = launch()
    for r in rows:  # cancelled
        if r.finish_reason is None:
            r.finish_reason = "cancelled"


def _read(st: ds.StepState, k: int) -> dict:
    """Every output of the last k steps in ONE device-to-host copy (ids < 2^53 are exact in float64)."""
    parts = [st.out_tok, st.out_conf, st.out_n, st.out_rej, st.out_sent, st.out_cache, st.out_reason,
             st.out_guard, st.out_live, st.done]
    flat = torch.cat([p.reshape(-1).double() for p in parts]).tolist()
    out, at = {}, 0
    names = ["tok", "conf", "n", "rej", "sent", "cache", "reason", "guard", "live", "done"]
    for name, p in zip(names, parts):
        n = p.numel()
        vals = flat[at:at + n]
        at += n
        if name != "conf":
            vals = [int(v) for v in vals]
        out[name] = _shape(vals, p.shape)
    return out


def _shape(vals: list, shape) -> list:
    if len(shape) == 1:
        return vals
    step = len(vals) // shape[0]
    return [_shape(vals[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _record(tok, r: RowText, got: dict, s: int, i: int, cfg, tau: float, pass_index: int, width: int, source,
            seconds: float) -> PassRecord:
    n, rej = got["n"][s][i], got["rej"][s][i]
    props = got["tok"][s][i][:n + rej]
    conf = got["conf"][s][i][:n + rej]
    reason = REASONS.get(got["reason"][s][i])
    n2, reason, piece = take(tok, r, props, n, cfg.stop_strings, reason)
    accepted = props[:n2]
    sent = got["sent"][s][i]
    return PassRecord(
        row=i, pass_index=pass_index, token_ids=accepted, text=piece, confidences=conf[:n2],
        rejected_token_ids=props[n2:], rejected_confidences=conf[n2:], tau=tau, seconds=seconds,
        cache_len=got["cache"][s][i], input_len=width, finish_reason=reason, drafts_sent=sent,
        draft_source=source if sent else None, repeat_guard=bool(got["guard"][s][i]) and n2 == n,
    )
