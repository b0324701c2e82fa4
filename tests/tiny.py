"""A tiny random causal LM with a real tokenizer, built locally in well under a second.

Word-level tokenizer with a chat template, an EOS and a `<|mask|>` token; Llama or Qwen2 weights.
float64 by default: exactness tests (cached == uncached, batch == alone) then compare paths whose
floating-point sums are ordered differently without near-ties flipping an argmax.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = (
    "the a of and to in is it that was for on are with as his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which "
    "do their time if will way about many then them write would like so these her long make thing see him "
    "two has look more day could go come did number sound no most people my over know water than call "
    "first who may down side been now find any new work part take get place made live where after back "
    "little only round man year came show every good me give our under name very through just form sentence "
    "great think say help low line differ turn cause much mean before move right boy old too same tell does "
    "set three want air well also play small end put home read hand port large spell add even land here "
    "must big high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father capital france paris user assistant system what's 1 2 3 4 5 6 7 8 9 0 "
    "+ = ? . , ! : ; ' \" ( )"
).split()
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def make_tokenizer(mask: bool = True, name_mask: bool = True):
    """mask: the vocabulary holds `<|mask|>`; name_mask: the tokenizer names it `mask_token` (the paper's
    checkpoints hold it as an added special token without naming it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS if mask else [s for s in SPECIALS if s != "<|mask|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(WORDS)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit()])
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        mask_token="<|mask|>" if mask and name_mask else None,
        additional_special_tokens=["<|mask|>"] if mask and not name_mask else [],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_model(tok, arch: str = "llama", seed: int = 0, dtype=torch.float64, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked logits: a random model with clear argmaxes, not a flat one
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(dtype).eval()


def make_loaded(arch: str = "llama", seed: int = 0, dtype=torch.float64, mask: bool = True):
    """A LoadedModel around a fresh tiny model (no disk)."""
    from mars.models.loading import LoadedModel

    tok = make_tokenizer(mask)
    model = make_model(tok, arch, seed, dtype)
    mask_id = tok.mask_token_id if mask else None
    return LoadedModel(model, tok, f"tiny-{arch}", mask_id, tok.mask_token if mask else None, None, None)


def save_tiny(folder: Path, arch: str = "llama", seed: int = 0, a2d: bool = False, dtype=torch.float32,
              tok=None) -> Path:
    """Write a tiny checkpoint folder; `a2d=True` mimics the paper's published checkpoints' config; `tok`: another
    make_tokenizer's (the default names `<|mask|>` its mask token)."""
    tok = make_tokenizer() if tok is None else tok
    model = make_model(tok, arch, seed, dtype)
    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    if a2d:
        cfg_path = folder / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model_type"] = "a2d-" + cfg["model_type"]
        cfg["architectures"] = ["A2DQwen2LMHeadModel"]
        cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_a2d.A2DQwen2LMHeadModel"}
        cfg_path.write_text(json.dumps(cfg, indent=2))
    return folder


def random_lora(model, r=4, scale=0.3, seed=0):
    """A peft LoRA on `model` with large random weights (a fresh one is zero: it would change nothing)."""
    from peft import LoraConfig, get_peft_model

    from mars.training.train import LORA_TARGETS

    m = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(LORA_TARGETS)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return m
