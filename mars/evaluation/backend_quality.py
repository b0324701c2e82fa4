"""How much a lossy backend (fast-int8, fast-bf16) changes a model's text, against the exact float one.

For each backend, on the same prompts: its greedy (or MARS) text, that text's mean NLL under the exact
reference model (the float32 model through transformers: `mean_nll`), exact and prefix match with the
reference backend's text, and known-answer accuracy. Returned as rows of data; benchmarks/int8_quality.py prints.
"""

from __future__ import annotations


def backend_quality(lm, scorer, prompts: list[list[int]], backends: tuple[str, ...], max_new: int,
                    known: tuple[list[list[int]], list[str]] | None = None, mode: str = "ar", tau: float = 1.0,
                    block_size: int | None = None, batch_size: int = 8, reference: str = "fast") -> list[dict]:
    """One row per backend: nll (mean over prompts, nats/token, under `scorer`), nll_ratio (to `reference`'s),
    exact_match / prefix_match with `reference`'s text, known-answer accuracy (and right/total).

    `lm` decodes (bare, or with an adapter for mode "mars"); `scorer` is the bare float model that judges.
    """
    from mars.decoding.decoder import DecodeConfig, generate_ids
    from mars.evaluation.evaluate import known_answer_accuracy
    from mars.evaluation.quality import mean_nll, prefix_match

    if reference not in backends:
        backends = (reference,) + tuple(backends)

    def generate(ids, backend):
        cfg = DecodeConfig(mode=mode, tau=tau, block_size=block_size or lm.default_block_size,
                           max_new_tokens=max_new, backend=backend)
        out = []
        for i in range(0, len(ids), batch_size):
            out += generate_ids(lm, ids[i:i + batch_size], cfg)
        return out

    texts = {b: generate(prompts, b) for b in backends}
    ref = [r.token_ids for r in texts[reference]]
    rows = []
    for b in backends:
        toks = [r.token_ids for r in texts[b]]
        nll = [mean_nll(scorer, p, t) for p, t in zip(prompts, toks) if t]
        row = {"backend": b, "mode": mode, "tau": tau if mode == "mars" else None,
               "tokens_per_pass": sum(map(len, toks)) / max(1, sum(r.passes for r in texts[b])),
               "nll": sum(nll) / max(1, len(nll)),
               "exact_match": sum(a == t for a, t in zip(ref, toks)) / len(toks),
               "prefix_match": sum(prefix_match(a, t) for a, t in zip(ref, toks)) / len(toks)}
        if known:
            res = generate(known[0], b)
            row["known_right"] = round(known_answer_accuracy(res, known[1]) * len(res))
            row["known_total"] = len(res)
        rows.append(row)
    base = next(r["nll"] for r in rows if r["backend"] == reference)
    for r in rows:
        r["nll_ratio"] = r["nll"] / base if base else None
    return rows


def format_rows(rows: list[dict]) -> str:
    head = (f"{'backend':<11}{'mode':<10}{'tokens/pass':>12}{'NLL':>8}{'NLL ratio':>11}{'exact':>7}{'prefix':>8}"
            f"{'known':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        mode = r["mode"] + (f" {r['tau']}" if r["tau"] is not None else "")
        known = f"{r['known_right']}/{r['known_total']}" if "known_total" in r else "-"
        lines.append(f"{r['backend']:<11}{mode:<10}{r['tokens_per_pass']:>12.2f}{r['nll']:>8.3f}{r['nll_ratio']:>10.3f}x"
                     f"{r['exact_match']:>7.2f}{r['prefix_match']:>8.2f}{known:>8}")
    return "\n".join(lines)
