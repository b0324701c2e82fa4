"""Quality measures for a generation, relative to the plain AR model: small pure functions.

- `mean_nll`: how likely the AR model finds a text (one teacher-forced causal forward of prompt + text).
- `prefix_agreement`, `prefix_match`: how much of the AR output a run reproduced exactly, from the start.
- `adjacent_repeats`, `stutters`: words a run repeats back to back ("Europe Europe", "South America South
  America") that the AR text of the same prompt does not repeat.
"""

from __future__ import annotations

import re
from collections import Counter

import torch
import torch.nn.functional as F

from mars.decoding.acceptance import matched_prefix


def mean_nll(lm, prompt_ids: list[int], token_ids: list[int]) -> float:
    """Mean negative log-likelihood (nats per token) of `token_ids` after `prompt_ids` under the causal model.

    One forward over [prompt | tokens] with the model's default causal attention; the logits at position t
    are scored against token t+1 (the usual shift), so only the generated tokens are scored.
    """
    if not prompt_ids or not token_ids:
        raise ValueError("mean_nll needs at least one prompt token and one generated token")
    model = lm.model
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], dtype=torch.long, device=device)  # (1, P + T)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]  # (P + T, V)
    if logits.dtype != torch.float64:
        logits = logits.float()  # bf16 / fp16 models: score in float32
    P = len(prompt_ids)
    scoring = logits[P - 1:-1]  # (T, V): the position before each generated token
    targets = torch.tensor(list(token_ids), dtype=torch.long, device=scoring.device)
    return float(F.cross_entropy(scoring, targets, reduction="mean"))


def prefix_agreement(reference: list[int], candidate: list[int]) -> float:
    """Length of the common prefix over the longer of the two: 1.0 only for identical sequences."""
    longest = max(len(reference), len(candidate))
    return matched_prefix(reference, candidate) / longest if longest else 1.0


def prefix_match(reference: list[int], candidate: list[int]) -> float:
    """Fraction of the reference reproduced before the first difference (the bench's prefix_match_with_ar)."""
    return matched_prefix(reference, candidate) / len(reference) if reference else 1.0


def words(text: str) -> list[str]:
    """The words a reader sees, lower-cased; punctuation and markup are not words."""
    return re.findall(r"\w+", text.lower())


def adjacent_repeats(items: list, sizes: tuple[int, ...] = (1, 2)) -> Counter:
    """Immediately repeated n-grams: n-gram -> how often it comes twice in a row, for n in `sizes`.

    ["in", "europe", "europe"] has ("europe",) once; "south america south america" has ("south", "america")
    once (and no repeated single word). A 2-gram made of one word twice ("a a a a") is counted as 1-grams only.
    """
    found: Counter = Counter()
    for n in sizes:
        for i in range(n, len(items) - n + 1):
            gram = tuple(items[i:i + n])
            if gram == tuple(items[i - n:i]) and not (n > 1 and len(set(gram)) == 1):
                found[gram] += 1
    return found


def stutters(text: str, reference: str, sizes: tuple[int, ...] = (1, 2)) -> dict:
    """Repeats of `text` that `reference` (the AR text of the same prompt) does not have, as data.

    Counted on words, as a visitor reads them: each immediately repeated n-gram of the text, minus as many
    of the same n-gram as the reference repeats (a list that legitimately says "very very" in both is no
    stutter). Returns {"extra": count, "words": words in text, "examples": [" ".join(gram), ...]}.
    """
    extra = adjacent_repeats(words(text), sizes) - adjacent_repeats(words(reference), sizes)
    return {"extra": sum(extra.values()), "words": len(words(text)),
            "examples": [" ".join(g) for g in sorted(extra)]}


def stutter_rate(texts: list[str], references: list[str], sizes: tuple[int, ...] = (1, 2)) -> dict:
    """Over prompts: extra repeats per 100 words, the share of texts with at least one, and examples."""
    if len(texts) != len(references):
        raise ValueError(f"stutter_rate needs one reference per text, got {len(texts)} and {len(references)}")
    per = [stutters(t, r, sizes) for t, r in zip(texts, references)]
    n_words = sum(p["words"] for p in per)
    return {"extra_repeats": sum(p["extra"] for p in per),
            "per_100_words": 100 * sum(p["extra"] for p in per) / max(1, n_words),
            "texts_with_stutter": sum(p["extra"] > 0 for p in per) / max(1, len(per)),
            "examples": sorted({e for p in per for e in p["examples"]})}
