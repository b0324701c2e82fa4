"""The paper's published checkpoints: the registry, and loading one offline from a local copy of the same shape."""

from __future__ import annotations

import re

import pytest
import torch

import tiny
from mars.models import hub
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.models.loading import LoadError, load

BLK4 = "Xalphinions/MARS-Qwen2.5-0.5B-blk4"


def test_registry_lists_the_authors_checkpoints():
    ids = [c.hub_id for c in hub.PAPER_CHECKPOINTS]
    assert len(ids) == len(set(ids))
    for size in ("0.5B", "7B"):
        for suffix in ("blk4", "blk8", "blk16", "AR-SFT"):
            assert f"Xalphinions/MARS-Qwen2.5-{size}-{suffix}" in ids
    assert not any("BD3LM" in i for i in ids)  # block diffusion: not decodable with a causal mask
    for c in hub.PAPER_CHECKPOINTS:
        m = re.search(r"-blk(\d+)", c.hub_id)
        assert c.block_size == (int(m.group(1)) if m else None)
        assert c.base_model == f"Qwen/Qwen2.5-{c.hub_id.split('-')[2]}-Instruct"
        assert c.kind == ("ar-sft" if c.hub_id.endswith("AR-SFT") else "mars-no-sft" if "no-sft" in c.hub_id
                          else "mars")
    assert hub.find_checkpoint(BLK4).fits_cpu_space
    assert not hub.find_checkpoint(BLK4.replace("0.5B", "7B")).fits_cpu_space


def test_dropdown_choices_start_with_the_default():
    choices = hub.model_choices()
    assert choices[0][1] == "smollm2" and "default" in choices[0][0]
    assert [v for _, v in choices[1:]] == [c.hub_id for c in hub.PAPER_CHECKPOINTS]
    assert "needs ~30 GB" in dict((v, k) for k, v in choices)["Xalphinions/MARS-Qwen2.5-7B-blk4"]


def test_unreachable_hub_gets_a_plain_message_at_once():
    def never(*a):
        raise AssertionError("no load may be attempted")

    steps = []
    lm, msg = hub.load_checkpoint(BLK4, lambda f, m: steps.append((f, m)), load_fn=never,
                                  reachable=lambda: False, cached=lambda _: False)
    assert lm is None
    assert msg.startswith("The Hugging Face Hub cannot be reached from this server") and BLK4 in msg
    assert "current model keeps serving" in msg
    assert steps == [(0.0, f"checking whether the Hugging Face Hub can be reached for {BLK4}…")]


def test_empty_choice_and_load_errors_never_raise():
    assert hub.load_checkpoint("  ")[0] is None
    assert hub.load_checkpoint(None)[1] == "Pick a checkpoint from the list."

    def fails(name, adapter):
        raise LoadError("weights missing")

    lm, msg = hub.load_checkpoint(BLK4, load_fn=fails, reachable=lambda: True, cached=lambda _: False)
    assert lm is None and "Could not load Xalphinions/MARS-Qwen2.5-0.5B-blk4: weights missing" in msg

    def crashes(name, adapter):
        raise MemoryError("out of memory")

    lm, msg = hub.load_checkpoint(BLK4, load_fn=crashes, reachable=lambda: True, cached=lambda _: False)
    assert lm is None and "MemoryError: out of memory" in msg


@pytest.fixture()
def offline_hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding a tiny checkpoint shaped like the paper's (a2d-qwen2 config, <|mask|>
    tokenizer) under the blk4 Hub id, and the Hub switched off: the real Hub-id path, with no network."""
    import huggingface_hub.constants as constants

    repo = tmp_path / "hub" / ("models--" + BLK4.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    tiny.save_tiny(repo / "snapshots" / commit, arch="qwen2", seed=5, a2d=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo / "snapshots" / commit


def test_a_paper_checkpoint_loads_by_hub_id_from_the_cache_with_no_network(offline_hub_cache):
    assert hub.in_local_cache(BLK4) and not hub.in_local_cache("Xalphinions/MARS-Qwen2.5-0.5B-blk8")
    steps = []
    lm, msg = hub.load_checkpoint(BLK4, lambda f, m: steps.append((f, m)))
    assert lm is not None, msg
    assert msg == f"Loaded {BLK4}, trained block size 4."
    assert [f for f, _ in steps] == [0.0, 0.1, 1.0] and "from the local cache" in steps[1][1]
    assert type(lm.model).__name__ == "Qwen2ForCausalLM" and lm.mask_token == "<|mask|>"
    assert lm.trained_block_size == 4 and lm.adapter is None and lm.name == BLK4
    # the same weights as the folder itself: the Hub id resolved to this checkpoint, causal, exact
    folder = load(str(offline_hub_cache))
    ids = encode_prompt(lm.tokenizer, "what is the capital of france ?")
    for cfg in (DecodeConfig(mode="ar", max_new_tokens=12), DecodeConfig(tau=0.3, max_new_tokens=12)):
        assert generate_ids(lm, [ids], cfg)[0].token_ids == generate_ids(folder, [ids], cfg)[0].token_ids


def test_an_uncached_paper_checkpoint_offline_is_refused_plainly(offline_hub_cache):
    lm, msg = hub.load_checkpoint("Xalphinions/MARS-Qwen2.5-0.5B-blk8")  # the real reachability check: offline
    assert lm is None and msg == hub.unreachable_message("Xalphinions/MARS-Qwen2.5-0.5B-blk8")


def test_a_local_folder_of_the_same_shape_loads_with_no_hub_check(tmp_path):
    folder = tiny.save_tiny(tmp_path / "paper-shaped", arch="qwen2", a2d=True)

    def unreachable():
        raise AssertionError("a folder needs no Hub")

    steps = []
    lm, msg = hub.load_checkpoint(str(folder), lambda f, m: steps.append(m), reachable=unreachable)
    assert lm is not None and msg == f"Loaded {folder}."
    assert "from disk" in steps[0] and lm.model.dtype == torch.float32
    assert lm.trained_block_size is None  # not a registry id: nothing is assumed


def test_registry_notes_reach_the_model_panel():
    loaded = tiny.make_loaded("qwen2")
    lm, _ = hub.load_checkpoint("Xalphinions/MARS-Qwen2.5-0.5B-AR-SFT", load_fn=lambda n, a: loaded,
                                reachable=lambda: True, cached=lambda _: False)
    assert lm.trained_block_size is None and any("AR SFT control" in w for w in lm.warnings)
    seen = []
    lm, _ = hub.load_checkpoint("Xalphinions/MARS-Qwen2.5-0.5B-blk16-no-sft",
                                load_fn=lambda n, a: seen.append((n, a)) or tiny.make_loaded("qwen2"),
                                reachable=lambda: True, cached=lambda _: False)
    assert seen == [("Xalphinions/MARS-Qwen2.5-0.5B-blk16-no-sft", "none")]  # full fine-tunes: no adapter
    assert lm.trained_block_size == 16 and any("without the clean-stream" in w for w in lm.warnings)
