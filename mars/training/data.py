"""Chat-format JSONL -> tokenized training examples.

A line is either {"messages": [..., {"role": "assistant", "content": ...}]} (the last message is the
response) or a self-distilled record that also carries "prompt_ids" and "response_ids" (exact token ids
as generated: re-tokenizing decoded text can split differently at the prompt/response seam).
"""

from __future__ import annotations

from pathlib import Path

from mars.jsonl import read_jsonl
from mars.training.objective import Example


def to_example(record: dict, tokenizer, eos_id: int) -> Example:
    if "prompt_ids" in record and "response_ids" in record:
        resp = list(record["response_ids"])
        finished = bool(record.get("finished", resp[-1:] == [eos_id]))
        if finished and resp[-1:] != [eos_id]:
            resp.append(eos_id)
        return Example(list(record["prompt_ids"]), resp, finished)
    messages = record.get("messages")
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("each record needs 'messages' ending with an assistant message (or prompt_ids/response_ids)")
    text = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    resp = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
    finished = bool(record.get("finished", True))
    return Example(prompt, resp + ([eos_id] if finished else []), finished)


def load_examples(path: str | Path, tokenizer, eos_id: int, max_length: int | None = None) -> list[Example]:
    examples = []
    for rec in read_jsonl(path):
        ex = to_example(rec, tokenizer, eos_id)
        if max_length is not None and len(ex.prompt_ids) >= max_length - 1:
            continue  # nothing of the response would fit
        if ex.response_ids:
            examples.append(ex)
    if not examples:
        raise ValueError(f"{path}: no usable examples")
    return examples
