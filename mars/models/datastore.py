"""The default model's datastore (mars.decoding.datastore.Datastore) read from the shipped self-distillation
sets: the decoder only ever gets the table, handed to it on `LoadedModel.datastore`."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from mars import resources
from mars.decoding.datastore import Datastore
from mars.jsonl import read_jsonl

DEFAULT_SOURCES = resources.DATASTORE  # relative to the checkout, or to an installed wheel's share folder


def read_store(paths=DEFAULT_SOURCES, root: Path | None = None) -> Datastore:
    """From self-distillation files (JSON lines, gzipped or not, each with `response_ids`)."""
    return Datastore.from_sequences([row["response_ids"] for p in paths for row in read_jsonl(Path(root or ".") / p)])


@functools.lru_cache(maxsize=None)
def shipped_store(paths: tuple[str, ...] = DEFAULT_SOURCES, root: Path | None = None) -> Datastore | None:
    """The table over the shipped self-distillation sets (2.8 M entries, ~45 MB), built once per process (~4 s);
    None (once, with a warning) where its files are missing or corrupt: the tree then drafts from the masks
    and the text alone. Without `root`: the checkout or the installed wheel that holds them (mars.resources)."""
    try:
        return read_store(paths, root or resources.find(*paths) or resources.CHECKOUT)
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"datastore drafts off: could not read {', '.join(paths)} ({type(e).__name__}: {e})")
    return None
