"""Fresh training prompts written by the default model itself (the Magpie recipe, arXiv 2406.08464).

The chat template is fed up to the user turn's header and the model samples the user message
(temperature 1.0, top-p 0.95, cut at the first newline). Most samples are not usable prompts (code,
fragments, answers), so every sample goes through `usable` and a near-duplicate check, and samples that
come close to a held-out prompt, a known-answer question or an app example are dropped (they must stay
unseen by training).

Resumable: kept prompts are appended to --out as they come (one JSON line each, ids `magpie-<n>`); a
rerun reloads them, so dedupe holds across sessions, and continues with fresh seeds. `--max-minutes`
stops cleanly. Packed for committing with `--pack` (writes <out>.gz, read back on a fresh clone).

    python -m tools.magpie --out data/prompts/magpie.jsonl --threads 1 --max-minutes 120
    python -m tools.magpie --out data/prompts/magpie.jsonl --pack
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "data" / "prompts"
EXAMPLES = ROOT / "assets" / "examples.json"

# a usable prompt asks something: a question, or an instruction that starts with one of these verbs
INSTRUCTION_VERBS = {
    "explain", "describe", "write", "list", "give", "name", "tell", "summarize", "summarise", "compare",
    "suggest", "create", "provide", "discuss", "define", "translate", "rewrite", "calculate", "compose",
    "identify", "outline", "share", "recommend", "generate", "design", "imagine", "classify", "convert",
    "help", "analyze", "analyse", "evaluate", "find", "plan", "draft", "teach", "show", "solve", "make",
    "please", "can", "could", "would", "should", "is", "are", "do", "does", "what", "why", "how", "when",
    "where", "which", "who", "i", "i'm", "in", "if", "as",
}
# code and markup fragments, links, chat-template debris
FRAGMENT = re.compile(r"[{}<>\[\]|\\`#=;_~^*@$]|https?:|www\.|\.com\b|\.py\b|\bdef |\bimport |\breturn |\(\)|\s{3,}")
ENGLISH = {"the", "a", "an", "of", "to", "in", "is", "are", "what", "how", "can", "you", "i", "my", "me", "for",
           "and", "with", "do", "does", "why", "which", "who", "please", "your", "it", "that", "this", "on"}
STOPWORDS = {"a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "is", "are", "what", "how", "me",
             "you", "your", "my", "i", "can", "do", "does", "with", "about", "please", "that", "this", "it"}


def norm_words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def usable(text: str) -> str | None:
    """None if `text` reads as one English question or instruction; otherwise why it was dropped."""
    words = text.split()
    if not 4 <= len(words) <= 60 or not 15 <= len(text) <= 400:
        return "length"
    if FRAGMENT.search(text):
        return "code or markup"
    low = norm_words(text)
    # English only: plain ASCII, mostly letters, and at least one common English word
    if not text.isascii() or sum(c.isalpha() for c in text) < 0.7 * len(text.replace(" ", "")) or not (
        set(low) & ENGLISH
    ):
        return "language"
    if len(set(low)) < 0.6 * len(low) or _repeated_ngram(low, 3):
        return "repetition"
    if not text[0].isupper():
        return "fragment"
    if not (text.rstrip().endswith("?") or (low and low[0] in INSTRUCTION_VERBS)):
        return "asks nothing"
    if text.rstrip()[-1] not in ".?!":
        return "fragment"
    return None


def _repeated_ngram(words: list[str], n: int) -> bool:
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


class NearDuplicates:
    """Exact and near-duplicate detection: Jaccard similarity of content-word sets (and of word bigrams)
    against every kept text that shares a content word, through an inverted index."""

    def __init__(self, threshold: float = 0.7):
        self.threshold = threshold
        self.sets: list[frozenset] = []
        self.index: dict[str, list[int]] = {}

    @staticmethod
    def key(text: str) -> frozenset:
        return frozenset(w for w in norm_words(text) if w not in STOPWORDS)

    def find(self, text: str) -> bool:
        k = self.key(text)
        if not k:
            return True
        seen: set[int] = set()
        for w in k:
            for i in self.index.get(w, ()):
                if i in seen:
                    continue
                seen.add(i)
                other = self.sets[i]
                if len(k & other) / len(k | other) >= self.threshold:
                    return True
        return False

    def add(self, text: str) -> None:
        k = self.key(text)
        self.sets.append(k)
        for w in k:
            self.index.setdefault(w, []).append(len(self.sets) - 1)


def reserved_texts() -> list[str]:
    """Prompts training must never see: the held-out split, the known-answer questions, the app's examples."""
    texts = []
    for split in ("heldout", "known_answers"):
        for line in (PROMPTS / f"{split}.jsonl").read_text().splitlines():
            if line.strip():
                texts.append(json.loads(line)["prompt"])
    texts += [e["prompt"] for e in json.loads(EXAMPLES.read_text())]
    return texts


def read_rows(path: Path) -> list[dict]:
    """Kept rows of a (possibly interrupted) run; a fresh clone reads the committed .gz instead."""
    packed = path.with_name(path.name + ".gz")
    if path.exists():
        text = path.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    else:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by an interruption
    return rows


def pre_query_ids(tok) -> list[int]:
    """The chat template up to and including the user turn's header (system prompt included)."""
    marker = "\x00MAGPIE\x00"
    text = tok.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tok(text[: text.index(marker)], add_special_tokens=False)["input_ids"]


def sample_batch(lm, prefix: list[int], n: int, seed: int, max_new_tokens: int, top_p: float, temperature: float):
    """n sampled user messages, each cut at its first newline or end of turn (None if it never ended)."""
    import torch

    tok = lm.tokenizer
    newline_ids = {i for t, i in tok.get_vocab().items() if "\n" in tok.convert_tokens_to_string([t])}
    stop = torch.tensor(sorted(newline_ids | set(lm.eos_token_ids)))

    class StopAtLineEnd:  # per row: a row is done once it emitted a newline or EOS
        def __call__(self, input_ids, scores, **kwargs):
            return torch.isin(input_ids[:, len(prefix):], stop).any(dim=1)

    torch.manual_seed(seed)
    ids = torch.tensor([prefix] * n)
    out = lm.model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=True, top_p=top_p, top_k=0, temperature=temperature,
        max_new_tokens=max_new_tokens, stopping_criteria=[StopAtLineEnd()],
        pad_token_id=lm.eos_token_ids[0],
    )
    texts = []
    for row in out[:, len(prefix):].tolist():
        cut = next((j for j, t in enumerate(row) if t in newline_ids or t in lm.eos_token_ids), None)
        texts.append(None if cut is None else tok.decode(row[:cut], skip_special_tokens=True).strip())
    return texts


def pack(out: Path) -> None:
    """Write <out>.gz for committing. Rows the current filter rejects (it was tightened after they were
    drawn) are dropped from both files, so the responses are made for the packed prompts only."""
    rows = read_rows(out)
    kept = [r for r in rows if usable(r["prompt"]) is None]
    if len(kept) < len(rows):
        print(f"dropped {len(rows) - len(kept)} prompts the current filter rejects")
        rows = kept
        out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    dest = out.with_name(out.name + ".gz")
    dest.write_bytes(gzip.compress(payload, compresslevel=9, mtime=0))
    print(f"{len(rows)} prompts, {len(payload) / 1e6:.2f} MB -> {dest} ({dest.stat().st_size / 1e6:.2f} MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(PROMPTS / "magpie.jsonl"))
    ap.add_argument("--target", type=int, default=20000, help="stop once this many prompts are kept")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop cleanly after this long (0 = no cap)")
    ap.add_argument("--pack", action="store_true", help="only write <out>.gz from <out> and exit")
    args = ap.parse_args()
    out = Path(args.out)
    if args.pack:
        pack(out)
        return 0

    import torch

    from mars.models.loading import load

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = read_rows(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if rows and not out.exists():
        out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    reserved, kept = NearDuplicates(), NearDuplicates()
    for text in reserved_texts():
        reserved.add(text)
    for text in [json.loads(line)["prompt"] for line in (PROMPTS / "train.jsonl").read_text().splitlines() if line]:
        kept.add(text)  # the template prompts already in training: no need to write them again
    for r in rows:
        kept.add(r["prompt"])
    stats_path = out.with_name(out.stem + ".stats.json")
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {"samples": 0, "batches": 0, "dropped": {}}
    next_id = 1 + max((int(r["id"].rsplit("-", 1)[1]) for r in rows), default=-1)  # packing leaves gaps
    lm = load(adapter="none")
    prefix = pre_query_ids(lm.tokenizer)
    t0 = time.time()
    print(f"{len(rows)} kept so far, {stats['samples']} samples drawn; target {args.target}", flush=True)
    while len(rows) < args.target and not (args.max_minutes and time.time() - t0 > 60 * args.max_minutes):
        seed = 1_000_003 * (stats["batches"] + 1)  # a fresh seed per batch, stable across resumes
        texts = sample_batch(lm, prefix, args.batch_size, seed, args.max_new_tokens, args.top_p, args.temperature)
        new = []
        for text in texts:
            why = "unfinished" if text is None else usable(text)
            if why is None and reserved.find(text):
                why = "near a held-out prompt"
            elif why is None and kept.find(text):
                why = "duplicate"
            if why:
                stats["dropped"][why] = stats["dropped"].get(why, 0) + 1
                continue
            kept.add(text)
            new.append({"id": f"magpie-{next_id:05d}", "kind": "magpie", "prompt": text})
            next_id += 1
        with out.open("a") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in new)
        rows += new
        stats["samples"] += len(texts)
        stats["batches"] += 1
        stats_path.write_text(json.dumps(stats, indent=1))
        rate = len(rows) / max(stats["samples"], 1)
        print(f"batch {stats['batches']}: kept {len(rows)} ({rate:.0%} of {stats['samples']} samples), "
              f"{(time.time() - t0) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
