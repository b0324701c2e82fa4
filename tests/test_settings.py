"""One settings module (mars.settings): every variable typed, defaulted and checked there, read once, and the
README's and docs/deploying.md's tables rendered from it; nothing else in mars/ or app.py reads a MARS_ one."""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from mars import settings
from mars.cli import main as cli_main
from mars.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parent.parent


def test_defaults():
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.model, s.adapter, s.device, s.backend) == (None, "auto", "auto", "auto-int8")
    assert (s.threads, s.concurrency, s.queue_size, s.max_new_tokens, s.max_prompt_tokens) == (None, 2, 64, 512, 1024)
    assert (s.chart_every_s, s.text_every_s) == (3.0, 0.1)
    assert s.datastore and s.tree_cut and s.c_kernels and s.amx and s.c_layers
    assert not (s.public or s.gradio_share or s.static_compile or s.hf_hub_offline)
    assert (s.space_id, s.admin_token, s.allowed_models, s.models_dir, s.gguf, s.cpu_flags) == (None,) * 6
    assert s.gradio_server_name == "127.0.0.1"
    assert s.cache == Path.home() / ".cache" / "mars-playground"  # the one home of the cache folder
    assert Settings.from_env({"MARS_THREADS": "  ", "MARS_BACKEND": ""}) == s  # empty: unset


def test_every_field_names_its_variable_and_says_what_it_means():
    names = [f.metadata["env"] for f in fields(Settings)]
    assert len(set(names)) == len(names)
    for f in fields(Settings):
        assert f.metadata["help"] and "\n" not in f.metadata["help"] and "|" not in f.metadata["help"]
        if f.metadata["env"].startswith("MARS_"):  # the field is the variable, lowercased, without MARS_
            assert f.name == f.metadata["env"][len("MARS_"):].lower()
        else:
            assert f.name == f.metadata["env"].lower()


@pytest.mark.parametrize("env,field,value", [
    ({"MARS_THREADS": "3"}, "threads", 3),
    ({"MARS_CONCURRENCY": " 4 "}, "concurrency", 4),
    ({"MARS_QUEUE_SIZE": "1"}, "queue_size", 1),
    ({"MARS_MAX_NEW_TOKENS": "64"}, "max_new_tokens", 64),
    ({"MARS_MAX_PROMPT_TOKENS": "20"}, "max_prompt_tokens", 20),
    ({"MARS_CHART_EVERY_S": "inf"}, "chart_every_s", math.inf),
    ({"MARS_TEXT_EVERY_S": "0"}, "text_every_s", 0.0),
    ({"MARS_DATASTORE": "0"}, "datastore", False),
    ({"MARS_TREE_CUT": "off"}, "tree_cut", False),
    ({"MARS_C_LAYERS": "False"}, "c_layers", False),
    ({"MARS_C_KERNELS": "no"}, "c_kernels", False),
    ({"MARS_AMX": "0"}, "amx", False),
    ({"MARS_PUBLIC": "YES"}, "public", True),
    ({"MARS_STATIC_COMPILE": "1"}, "static_compile", True),
    ({"MARS_DEVICE": " CUDA "}, "device", "cuda"),
    ({"MARS_BACKEND": "fast-int8"}, "backend", "fast-int8"),
    ({"MARS_MODEL": "someone/model"}, "model", "someone/model"),
    ({"MARS_ADAPTER": "none"}, "adapter", "none"),
    ({"MARS_CPU_FLAGS": "avx, avx2 fma"}, "cpu_flags", frozenset({"avx", "avx2", "fma"})),
    ({"MARS_ALLOWED_MODELS": "a/b, c/d,,"}, "allowed_models", ("a/b", "c/d")),
    ({"MARS_MODELS_DIR": "~/models"}, "models_dir", Path.home() / "models"),
    ({"MARS_CACHE": "/tmp/mars-cache"}, "cache", Path("/tmp/mars-cache")),
    ({"MARS_GGUF": "/x/model.gguf"}, "gguf", Path("/x/model.gguf")),
    ({"MARS_ADMIN_TOKEN": "t" * 20}, "admin_token", "t" * 20),
    ({"SPACE_ID": "someone/mars"}, "space_id", "someone/mars"),
    ({"GRADIO_SERVER_NAME": "0.0.0.0"}, "gradio_server_name", "0.0.0.0"),
    ({"GRADIO_SHARE": "True"}, "gradio_share", True),
    ({"GRADIO_SHARE": "1"}, "gradio_share", False),  # Gradio's own reading: only "true"
    ({"HF_HUB_OFFLINE": "on"}, "hf_hub_offline", True),
    ({"HF_HUB_OFFLINE": "whatever"}, "hf_hub_offline", False),  # huggingface_hub's reading: never refused
])
def test_each_variable_is_parsed_to_its_type(env, field, value):
    assert getattr(Settings.from_env(env), field) == value


@pytest.mark.parametrize("name,raw,message", [
    ("MARS_THREADS", "abc", "MARS_THREADS must be a whole number of 1 or more, got 'abc'"),
    ("MARS_THREADS", "0", "MARS_THREADS must be a whole number of 1 or more, got '0'"),
    ("MARS_CONCURRENCY", "2.5", "MARS_CONCURRENCY must be a whole number of 1 or more, got '2.5'"),
    ("MARS_QUEUE_SIZE", "many", "MARS_QUEUE_SIZE must be a whole number of 1 or more, got 'many'"),
    ("MARS_MAX_NEW_TOKENS", "-1", "MARS_MAX_NEW_TOKENS must be a whole number of 1 or more, got '-1'"),
    ("MARS_CHART_EVERY_S", "soon", "MARS_CHART_EVERY_S must be a number of seconds, 0 or more (or inf), got 'soon'"),
    ("MARS_TEXT_EVERY_S", "nan", "MARS_TEXT_EVERY_S must be a number of seconds, 0 or more (or inf), got 'nan'"),
    ("MARS_TEXT_EVERY_S", "-0.1", "MARS_TEXT_EVERY_S must be a number of seconds, 0 or more (or inf), got '-0.1'"),
    ("MARS_PUBLIC", "ture", "MARS_PUBLIC must be 1 or 0 (true/false, yes/no, on/off), got 'ture'"),
    ("MARS_DEVICE", "gpu0", "MARS_DEVICE must be one of auto, cpu, cuda, got 'gpu0'"),
    ("MARS_BACKEND", "turbo", "MARS_BACKEND must be one of auto, fast, hf, fast-bf16, fast-int8, auto-int8, static, "
                              "got 'turbo'"),
    ("MARS_ALLOWED_MODELS", ",", "MARS_ALLOWED_MODELS must be comma-separated names, got ','"),
])
def test_a_bad_value_gets_one_message_naming_the_variable_and_the_value(name, raw, message):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({name: raw})
    assert str(e.value) == message
    assert isinstance(e.value, ValueError)  # the CLI's and the app's edges already print those as one line


def test_every_bad_variable_is_named_at_once_one_a_line():
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"MARS_THREADS": "two", "MARS_PUBLIC": "maybe", "MARS_CONCURRENCY": "3"})
    assert str(e.value).splitlines() == ["MARS_THREADS must be a whole number of 1 or more, got 'two'",
                                         "MARS_PUBLIC must be 1 or 0 (true/false, yes/no, on/off), got 'maybe'"]


def test_the_token_is_never_in_a_log_line():
    assert "t" * 20 not in repr(Settings.from_env({"MARS_ADMIN_TOKEN": "t" * 20}))


def test_settings_are_read_once_and_reload_reads_them_again(monkeypatch):
    monkeypatch.setenv("MARS_THREADS", "3")
    first = settings.reload()
    assert first.threads == 3 and settings.get() is first
    monkeypatch.setenv("MARS_THREADS", "5")
    assert settings.get().threads == 3  # read once: a running server keeps what it started with
    assert settings.reload().threads == 5 and settings.get().threads == 5
    monkeypatch.setenv("MARS_THREADS", "five")
    with pytest.raises(SettingsError, match="MARS_THREADS"):
        settings.reload()
    with pytest.raises(SettingsError, match="MARS_THREADS"):  # and on every later call, not a stale value
        settings.get()


def test_a_test_sees_its_own_environment_only(env):
    """conftest's fixtures: `env.set` is read on the next get(); the autouse one forgets it after the test."""
    assert settings.get().concurrency == int(os.environ.get("MARS_CONCURRENCY", "2"))
    env.set("MARS_CONCURRENCY", "7")
    assert settings.get().concurrency == 7


def test_the_next_test_does_not_see_the_last_ones_variables():
    assert settings.get().concurrency != 7


def _between_markers(path: Path) -> str:
    text = path.read_text()
    found = re.search(r"<!-- settings:start -->\n(.*?)<!-- settings:end -->", text, re.S)
    assert found, f"{path.name} has no settings table between its markers"
    return found.group(1)


@pytest.mark.parametrize("doc", ["README.md", "docs/deploying.md"])
def test_the_docs_list_the_settings_the_module_renders(doc):
    assert _between_markers(ROOT / doc) == settings.markdown_table(), (
        f"{doc}'s settings table is not mars/settings.py's: paste `python -m mars settings` between its markers")


def test_the_table_has_a_row_per_variable_with_its_default():
    table = settings.markdown_table()
    assert table.startswith("| variable | default | meaning |\n|---|---|---|\n")
    rows = table.splitlines()[2:]
    assert [r.split("|")[1].strip(" `") for r in rows] == settings.variables()
    assert "| `MARS_THREADS` | every core |" in table and "| `MARS_CONCURRENCY` | `2` |" in table
    assert "| `MARS_CHART_EVERY_S` | `3` |" in table and "| `MARS_DATASTORE` | `1` |" in table


def test_python_m_mars_settings_prints_the_table(capsys):
    assert cli_main(["settings"]) == 0
    assert capsys.readouterr().out == settings.markdown_table()


# ------------------------------------------------------------------ nothing else reads a MARS_ variable


def env_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each read of the environment that names a MARS_ variable (a literal, or a module-level
    constant holding one), and each use of os.environ whose name cannot be told (the whole mapping passed on)."""
    tree = ast.parse(source)
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def is_env(node) -> bool:  # os.environ, os.getenv, or `environ` / `getenv` imported from os
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            return node.attr in ("environ", "environb", "getenv")
        return isinstance(node, ast.Name) and node.id in ("environ", "getenv")

    def name_of(key) -> str | None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        if isinstance(key, ast.Name):
            return constants.get(key.id)
        return None

    found = []
    for node in ast.walk(tree):
        if not is_env(node):
            continue
        up = parents.get(node)
        key = None
        if isinstance(up, ast.Call) and up.func is node:  # getenv(key)
            key = up.args[0] if up.args else None
        elif isinstance(up, ast.Attribute) and isinstance(parents.get(up), ast.Call):  # environ.get(key)
            call = parents[up]
            key = call.args[0] if call.args else None
        elif isinstance(up, ast.Subscript):  # environ[key]
            key = up.slice
        elif isinstance(up, ast.Compare):  # key in environ
            key = up.left
        name = name_of(key) if key is not None else None
        if name is None:
            found.append((node.lineno, "the environment, by a name this test cannot read"))
        elif name.startswith("MARS_"):
            found.append((node.lineno, name))
    return found


def test_the_scanner_finds_every_kind_of_read():
    source = ('import os\nfrom os import environ\nNAME = "MARS_Y"\n'
              'a = os.environ.get("MARS_X")\nb = os.getenv(NAME)\nc = os.environ["MARS_Z"]\n'
              'd = "MARS_W" in os.environ\ne = dict(os.environ)\nf = environ.get("MARS_V", "1")\n'
              'g = os.environ.get("RANK", "0")\n')
    assert sorted(line for line, _ in env_reads(source)) == [4, 5, 6, 7, 8, 9]


def test_only_the_settings_module_reads_mars_variables():
    files = sorted((ROOT / "mars").rglob("*.py")) + [ROOT / "app.py"]
    reads = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "mars/settings.py":
            continue
        if found := env_reads(path.read_text()):
            reads[rel] = found
    assert reads == {}, f"ask mars.settings instead: {reads}"


def test_the_app_does_not_start_with_a_bad_value_and_says_which():
    env = {**os.environ, "MARS_THREADS": "abc", "MARS_QUEUE_SIZE": "0", "GRADIO_SERVER_PORT": "1",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-3:] == [
        "MARS Playground cannot start:", "MARS_THREADS must be a whole number of 1 or more, got 'abc'",
        "MARS_QUEUE_SIZE must be a whole number of 1 or more, got '0'"]
    assert "Traceback" not in out.stderr
