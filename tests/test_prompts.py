"""Checks on the prompt sets written by tools/build_prompts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "data" / "prompts"
EXAMPLES = ROOT / "assets" / "examples.json"
KINDS = [
    "facts", "lists", "definitions", "explanations", "howto",
    "creative", "math", "code", "rewrite", "translate",
]


def norm(text: str) -> str:
    return " ".join(text.lower().split())


def load_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def builder(load_script):
    return load_script("build_prompts")


@pytest.fixture(scope="module")
def data():
    return {
        "train": load_jsonl(PROMPTS / "train.jsonl"),
        "heldout": load_jsonl(PROMPTS / "heldout.jsonl"),
        "known_answers": load_jsonl(PROMPTS / "known_answers.jsonl"),
        "examples": json.loads(EXAMPLES.read_text(encoding="utf-8")),
    }


def test_enough_distinct_prompts(data):
    prompts = [r["prompt"] for r in data["train"] + data["heldout"]]
    assert len({norm(p) for p in prompts}) == len(prompts)
    assert len(prompts) >= 3000


def test_heldout_size_and_stratified(data):
    assert len(data["heldout"]) >= 100
    held_kinds = {r["kind"] for r in data["heldout"]}
    assert held_kinds == set(KINDS)


def test_schema(data):
    for split in ("train", "heldout"):
        for r in data[split]:
            assert set(r) == {"id", "kind", "prompt"}
            assert r["kind"] in KINDS
            assert r["id"].startswith(r["kind"] + "-")
            assert r["prompt"].strip()
    for r in data["known_answers"]:
        assert set(r) == {"id", "kind", "prompt", "answer"}
        assert r["kind"] in ("arithmetic", "capital")
        assert r["answer"].strip()
    ids = [r["id"] for r in data["train"] + data["heldout"] + data["known_answers"]]
    assert len(ids) == len(set(ids))


def test_each_kind_present(data):
    for kind in KINDS:
        n = sum(1 for r in data["train"] + data["heldout"] if r["kind"] == kind)
        assert n >= 250, kind


def test_known_answers(data):
    ka = data["known_answers"]
    assert len(ka) >= 120
    assert {r["kind"] for r in ka} == {"arithmetic", "capital"}
    for r in ka:
        if r["kind"] == "arithmetic":
            assert r["answer"].lstrip("-").isdigit()


def test_examples(data):
    ex = data["examples"]
    assert len(ex) == 12
    for e in ex:
        assert set(e) == {"label", "prompt"}
        assert e["label"].strip() and e["prompt"].strip()


def test_no_overlap(data):
    groups = {name: {norm(r["prompt"]) for r in rows} for name, rows in data.items()}
    names = list(groups)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not (groups[a] & groups[b]), f"{a} overlaps {b}"


def test_build_is_deterministic_and_matches_files(builder, data):
    first = builder.build()
    second = builder.build()
    assert first == second
    assert first == data


# --- prompts written by the model itself (tools/magpie.py) ---------------------------------------------


@pytest.fixture(scope="module")
def magpie(load_script):
    return load_script("magpie")


@pytest.mark.parametrize("text, why", [
    ("What are the advantages of renewable energy over fossil fuels?", None),
    ("Explain how a rainbow forms, in two sentences.", None),
    ("I'm planning a trip to Tokyo. Could you help me plan it?", None),
    ("def reverse(s): return s[::-1]", "code or markup"),
    ("Write a <b>bold</b> title for my blog post.", "code or markup"),
    ("See https://example.org for the full list of rules.", "code or markup"),
    ("Quelle est la capitale de la France? Répondez vite.", "language"),
    ("Can you list list list list the the the colours of flags?", "repetition"),
    ("The weather was lovely yesterday in the park.", "asks nothing"),
    ("Can you help me write a poem about the sea and the", "fragment"),
    ("and then what happens to the water when it boils?", "fragment"),
    ("Hi?", "length"),
])
def test_magpie_filter_keeps_questions_and_instructions_only(magpie, text, why):
    assert magpie.usable(text) == why


def test_magpie_near_duplicates(magpie):
    seen = magpie.NearDuplicates()
    seen.add("What are five ways to save water at home?")
    assert seen.find("what are five ways to save water at home")  # exact, up to case and punctuation
    assert seen.find("Can you name five ways to save water at home?")  # the same request, reworded
    assert not seen.find("What are five ways to save energy in an office?")
    assert seen.find("?!")  # nothing left after normalising: never a new prompt


def _training_prompt_files():
    """Every committed file training reads prompts from (the .gz where only the packed one is committed)."""
    files = [PROMPTS / "train.jsonl", ROOT / "data" / "selfdistill" / "train.jsonl.gz"]
    for path in (PROMPTS / "magpie.jsonl.gz", ROOT / "data" / "selfdistill" / "magpie.jsonl.gz"):
        if path.exists():
            files.append(path)
    return files


def test_training_data_never_holds_a_reserved_prompt(magpie):
    """Held-out prompts, known-answer questions and the app's examples stay out of all training data: no
    exact copy anywhere, and no near-duplicate among the model-written prompts (the generator drops them)."""
    from mars.jsonl import read_jsonl

    reserved_texts = magpie.reserved_texts()
    assert len(reserved_texts) >= 150 + 120 + 12
    exact = {norm(t) for t in reserved_texts}
    near = magpie.NearDuplicates()
    for t in reserved_texts:
        near.add(t)
    for path in _training_prompt_files():
        rows = read_jsonl(path)
        assert rows, path
        assert not [r["prompt"] for r in rows if norm(r["prompt"]) in exact], path
        if "magpie" in path.name:
            assert not [r["prompt"] for r in rows if near.find(r["prompt"])], path
