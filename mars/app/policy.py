"""Who may change the model every visitor shares, and what may be loaded: one policy, read from the
environment once, checked on the server by every handler that can switch the model.

Why: on a public deployment any visitor could otherwise swap in any Hub model for every other visitor, or
ask for a checkpoint far larger than the machine (the download fills the disk, the load exhausts memory,
the server goes down for everyone). Hiding a button is not enough: Gradio serves every event by API name
and by index, so the handler itself refuses.

Who may switch (`switch_mode`):
- "open": a server bound to loopback only, not on a Space (a laptop in a talk): anyone who can reach it.
- "token": MARS_ADMIN_TOKEN is set: whoever types it in the Model tab, on any server.
- "closed": a public server without a token (Hugging Face sets SPACE_ID; any non-loopback bind, a Gradio
  share link, or MARS_PUBLIC=1 for a server behind a reverse proxy): nobody, by any route.
What may load (`check_model_request`, `check_adapter`): Hub ids on MARS_ALLOWED_MODELS (default: the paper's
checkpoints and the default model; `*` admits any Hub id, still sized), and folders under MARS_MODELS_DIR
(unset: none). A folder outside it and a folder absent from it get the same message, decided without
looking outside it. How big (`sizing`): Hub models are sized from the Hub's metadata before any download.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from mars import settings
from mars.models.hub import PAPER_CHECKPOINTS
from mars.models.loading import DEFAULT_MODEL

DEFAULT_ALLOWED = (DEFAULT_MODEL,) + tuple(c.hub_id for c in PAPER_CHECKPOINTS)
ANY_HUB_ID = "*"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96}$")
MIN_TOKEN = 16  # a token a visitor could guess is no lock: `python -c "import secrets; print(secrets.token_urlsafe(24))"`
MAX_NAME = 300  # longer names are not models; they are not echoed whole either


class PolicyError(ValueError):
    """A request this server refuses; the message is for the visitor and names nothing on the server."""


@dataclass(frozen=True)
class ModelRequest:
    kind: str  # "default" (the embedded model), "hub" (an allowed Hub id), "folder" (under MARS_MODELS_DIR)
    name: str  # what load() gets: "smollm2", the Hub id, or the folder's resolved path
    shown: str  # what the visitor typed, for messages


def is_loopback(host: str | None) -> bool:
    """True for an address only this machine can reach: 127.0.0.0/8, ::1, localhost. "" and 0.0.0.0 (every
    interface) are not."""
    host = (host or "").strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Policy:
    # Hugging Face sets SPACE_ID on every Space: public, whatever address the app binds inside it
    space_id: str | None = None
    # the addresses the server listens on (Gradio's server_name, and its SSR node server's when it has one)
    hosts: tuple[str, ...] = ("127.0.0.1",)
    share: bool = False  # a Gradio share link brings the world to a loopback server
    forced_public: bool = False  # MARS_PUBLIC=1: a loopback server behind a reverse proxy is public too
    admin_token: str | None = field(default=None, repr=False)  # never in a log line
    allowed_models: tuple[str, ...] = DEFAULT_ALLOWED  # Hub ids (and "smollm2"); "*": any Hub id
    models_dir: Path | None = None  # folders load from here only; None: no folders at all
    queue_size: int = 64  # events waiting beyond the running ones; more get Gradio's "busy, try again"
    # repo id -> huggingface_hub ModelInfo with file sizes (None: the real Hub); tests serve a fake Hub
    hub_info: Callable | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.models_dir is not None:  # compared with resolved paths below: /tmp may be a link
            object.__setattr__(self, "models_dir", Path(self.models_dir).expanduser().resolve())
        if self.admin_token is not None and len(self.admin_token) < MIN_TOKEN:
            raise ValueError(f"MARS_ADMIN_TOKEN must be at least {MIN_TOKEN} characters (a random one: "
                             "python -c \"import secrets; print(secrets.token_urlsafe(24))\")")
        for name in self.allowed_models:
            if name not in (ANY_HUB_ID, DEFAULT_MODEL) and not HUB_ID.match(name):
                raise ValueError(f"MARS_ALLOWED_MODELS: {name!r} is not a Hub id (owner/name), {DEFAULT_MODEL!r} "
                                 f"or {ANY_HUB_ID!r}")
        if self.models_dir is not None and not self.models_dir.is_dir():
            raise ValueError(f"MARS_MODELS_DIR={str(self.models_dir)!r} is not a folder")
        if not isinstance(self.queue_size, int) or isinstance(self.queue_size, bool) or self.queue_size < 1:
            raise ValueError(f"MARS_QUEUE_SIZE must be a whole number of 1 or more, got {self.queue_size!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "Policy":
        """The policy of a server started with `env` (default: this process's settings, mars.settings);
        `overrides` replace fields."""
        s = settings.get() if env is None else settings.Settings.from_env(env)
        values = dict(
            space_id=s.space_id,
            hosts=(s.gradio_server_name,),
            share=s.gradio_share,
            forced_public=s.public,
            admin_token=s.admin_token,
            allowed_models=s.allowed_models or DEFAULT_ALLOWED,
            models_dir=s.models_dir,
            queue_size=s.queue_size,
        )
        return cls(**(values | overrides))

    def bound_to(self, hosts: tuple[str, ...], share: bool) -> "Policy":
        """The same policy for a server that listens on `hosts` (its share link on or off)."""
        return replace(self, hosts=tuple(hosts), share=bool(share))

    # -------------------------------------------------------------------------------------- who may switch
    @property
    def public(self) -> bool:
        return bool(self.space_id) or self.share or self.forced_public or not all(map(is_loopback, self.hosts))

    @property
    def why_public(self) -> str:
        if self.space_id:
            return "it runs as a Hugging Face Space"
        if self.share:
            return "it is reachable through a share link"
        if self.forced_public:
            return "its operator marked it public (MARS_PUBLIC)"
        return "it listens on a network address"

    @property
    def switch_mode(self) -> str:
        if self.admin_token:
            return "token"
        return "closed" if self.public else "open"

    def may_switch(self, token: object = None) -> tuple[bool, str]:
        """(allowed?, the visitor's message when not). Tokens compare in constant time."""
        mode = self.switch_mode
        if mode == "open":
            return True, ""
        if mode == "token":
            given = token.encode("utf-8", "surrogatepass") if isinstance(token, str) else b""
            if given and hmac.compare_digest(given, self.admin_token.encode("utf-8", "surrogatepass")):
                return True, ""
            what = "the token given is not it" if given else "no token was given"
            return False, (f"Changing the model on this server needs the operator token ({what}). "
                           "The current model keeps serving.")
        return False, (f"This server is public ({self.why_public}): its operator chose the model, and no visitor "
                       "can change it for the others. To try another model, run the app on your own machine "
                       "(see the Model tab). The current model keeps serving.")

    # -------------------------------------------------------------------------------------- what may load
    @property
    def any_hub_id(self) -> bool:
        return ANY_HUB_ID in self.allowed_models

    def allows_hub_id(self, name: str) -> bool:
        return name in self.allowed_models or (self.any_hub_id and name != DEFAULT_MODEL and bool(HUB_ID.match(name)))

    def not_offered(self, name: str, what: str = "model") -> str:
        shown = name if len(name) <= 100 else name[:100] + "…"
        hub = "any Hub id" if self.any_hub_id else "the Hub ids on its list"
        folders = " and the folders in its models folder" if self.models_dir else ""
        return (f"{what.capitalize()} {shown!r} is not offered on this server: it loads {hub}{folders}. "
                "The current model keeps serving.")

    def check_model_request(self, name: object) -> ModelRequest:
        """The model to load for `name`, or PolicyError with one message (an absent folder and a forbidden
        one read the same)."""
        if not isinstance(name, str) or not name.strip():
            raise PolicyError("Give a Hub id (e.g. Xalphinions/MARS-Qwen2.5-0.5B-blk4) or a folder name.")
        name = name.strip()
        if len(name) <= MAX_NAME:
            if name == DEFAULT_MODEL and name in self.allowed_models:
                return ModelRequest("default", name, name)
            if self.allows_hub_id(name):
                return ModelRequest("hub", name, name)
            folder = self._folder(name)
            if folder is not None:
                return ModelRequest("folder", str(folder), name)
        raise PolicyError(self.not_offered(name))

    def check_adapter(self, adapter: object) -> str:
        """"auto", "none", or the resolved folder of an adapter under MARS_MODELS_DIR; else PolicyError."""
        adapter = adapter.strip() if isinstance(adapter, str) else ""
        if adapter.lower() in ("", "auto", "none"):
            return adapter.lower() or "auto"
        folder = self._folder(adapter) if len(adapter) <= MAX_NAME else None
        if folder is None:
            raise PolicyError(self.not_offered(adapter, "adapter"))
        return str(folder)

    def _folder(self, name: str) -> Path | None:
        """`name` as a folder inside MARS_MODELS_DIR (relative to it, or absolute within it), else None.

        Decided by path arithmetic first, so nothing outside the folder is ever looked at (no answer or
        timing tells a visitor what exists there); then symlinks are resolved and checked again, so a link
        inside cannot lead outside.
        """
        root = self.models_dir
        if root is None or "\x00" in name:
            return None
        candidate = Path(os.path.normpath(root / name))  # an absolute name replaces root: checked below
        if candidate == root or not candidate.is_relative_to(root):
            return None
        try:
            resolved = candidate.resolve()
        except (OSError, RuntimeError):  # a symlink loop, a name too long for the file system
            return None
        if resolved == root or not resolved.is_relative_to(root) or not resolved.is_dir():
            return None
        return resolved
