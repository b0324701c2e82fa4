"""The project's one JSON-lines reader: datasets, prompt files, training logs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def read_jsonl(path: str | Path, plain: bool = False) -> list:
    """Rows of a JSONL file; a `.gz` file is read compressed (the committed datasets are). Blank lines are
    skipped; a line that is not valid JSON is a ValueError naming the file and line. plain: a line that does
    not start with "{" comes back as its stripped text (a prompt file mixing plain lines and JSON rows)."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text()
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if plain and not line.startswith("{"):
            rows.append(line)
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from e
    return rows
