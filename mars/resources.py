"""Where the library finds the files it ships beside its code: the default model's MARS adapter and the
self-distillation sets the default model's datastore drafts from. Nothing else in `mars/` reads a repository
file at run time (the held-out prompts and training data are read by tools/ and benchmarks/ only).

The files live in the repository (`assets/mars-adapter/`, `data/selfdistill/`). A wheel installs the same
files at the same relative paths under `<data prefix>/share/mars-playground/` (pyproject.toml,
`[tool.setuptools.data-files]`): `sys.prefix` for a virtual environment or a system install, `site.USER_BASE`
(`~/.local`) for `pip install --user`. Each lookup tries, first match wins:

1. the checkout this `mars/` was imported from (the folder above it: a clone, an editable install, the
   Docker image, which copies the repository);
2. the installed distribution's share folder, as its RECORD names it (right for any install scheme), or
   beside its dist-info (`pip install --target`), then `share/mars-playground` under `sys.prefix`,
   `site.USER_BASE` and the interpreter's data path.

This module imports nothing from `mars`, torch or transformers, and reads no environment variable.
"""

from __future__ import annotations

import functools
import site
import sys
import sysconfig
from pathlib import Path

DISTRIBUTION = "mars-playground"  # pyproject.toml's [project] name
SHARE = f"share/{DISTRIBUTION}"  # the wheel's data-files folder, under the install scheme's data prefix
CHECKOUT = Path(__file__).resolve().parents[1]  # the folder holding mars/: the repository root in a checkout

ADAPTER = "assets/mars-adapter"  # the default model's MARS adapter, relative to a root
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json", "mars.json")  # what loading reads
DATASTORE = ("data/selfdistill/train.jsonl.gz", "data/selfdistill/magpie.jsonl.gz")  # the datastore's sources


def find(*relative: str) -> Path | None:
    """The first root (see the module doc) that holds every one of `relative` (paths with `/`), else None."""
    for root in _roots():
        if all((root / rel).is_file() for rel in relative):
            return root
    return None


def adapter_dir() -> Path | None:
    """The shipped MARS adapter's folder (its weights, peft config and mars.json), None where none is found."""
    root = find(*(f"{ADAPTER}/{name}" for name in ADAPTER_FILES))
    return None if root is None else root / ADAPTER


def datastore_root() -> Path | None:
    """The root that holds both datastore sources (`DATASTORE`, relative to it), None where none does."""
    return find(*DATASTORE)


def looked_in() -> list[Path]:
    """Every root a lookup tries, in order (for messages that say where a missing file was looked for)."""
    return list(_roots())


def _roots():
    yield CHECKOUT
    yield from _installed_roots()


@functools.lru_cache(maxsize=None)
def _installed_roots() -> tuple[Path, ...]:
    found = []
    for base in _recorded_shares() + [Path(p) / SHARE for p in _prefixes()]:
        if base.is_dir() and base not in found:
            found.append(base)
    return tuple(found)


def _recorded_shares() -> list[Path]:
    """The share folder of each installed `mars-playground` (first on sys.path first): where its RECORD says,
    then beside its dist-info (`pip install --target` moves the files there and leaves RECORD's paths as they
    were relative to a temporary prefix)."""
    from importlib import metadata

    shares = []
    try:
        dists = list(metadata.distributions(name=DISTRIBUTION))
    except Exception:  # a broken dist-info elsewhere on sys.path must not stop the lookup
        return shares
    for dist in dists:
        for entry in dist.files or ():
            text = entry.as_posix()
            at = text.find(SHARE + "/")
            if at >= 0 and (at == 0 or text[at - 1] == "/"):
                shares.append(Path(dist.locate_file(text[: at + len(SHARE)])).resolve())
                break
        shares.append(Path(dist.locate_file("")).resolve() / SHARE)
    return shares


def _prefixes() -> list[str]:
    prefixes = [sys.prefix, sysconfig.get_path("data")]
    try:
        prefixes.append(site.getuserbase())
    except Exception:
        pass
    return [p for p in prefixes if p]
