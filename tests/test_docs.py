"""The user documentation against the code: settings, command-line options, links, the README's promises.

Fast, and no worker, but for the README's Python snippets, each of which runs as a new user would run it
(in a process of its own, against the session's worker).
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import click
import pytest

from sklearn_gpu_bridge import config
from sklearn_gpu_bridge.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

DEMO = "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/sklearn-gpu-bridge demo"
TESTS = 'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest -m "not slow"'
README_MAX_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


@pytest.fixture(autouse=True)
def _bridge_to_worker():
    """Replaces conftest's: these tests read files and tables, and need no worker."""
    yield


def _text(path):
    return path.read_text(encoding="utf-8")


def _prose(text):
    """The text without fenced blocks and code spans, where a link is only an example."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", _text(path))):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        base, n = slug, 1
        while slug in found:
            slug, n = f"{base}-{n}", n + 1
        found.add(slug)
    return found


def _relative_links(path):
    for target in _LINK.findall(_prose(_text(path))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
            continue  # http:, https:, mailto: ...
        yield target


def _commands(group, prefix=()):
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


# (a) settings


@pytest.mark.parametrize("name", sorted(config.DEFAULTS))
def test_every_client_setting_is_documented_with_its_environment_variable(name):
    text = _text(DOCS / "configuration.md")
    assert f"`{name}`" in text, f"docs/configuration.md does not describe the client setting {name!r}"
    variable = config.ENV_PREFIX + name.upper()
    assert variable in text, f"docs/configuration.md does not name {variable}"


@pytest.mark.parametrize("name", sorted(config.WORKER_DEFAULTS))
def test_every_worker_setting_is_documented_with_its_environment_variable(name):
    text = _text(DOCS / "configuration.md")
    assert f"`{name}`" in text, f"docs/configuration.md does not describe the worker setting {name!r}"
    variable = f"{config.WORKER_ENV_PREFIX}_{name.upper()}"
    assert variable in text, f"docs/configuration.md does not name {variable}"


# (b) the command line


@pytest.mark.parametrize("path, command", [pytest.param(p, c, id=" ".join(p)) for p, c in _commands(main)])
def test_every_command_and_option_is_in_the_cli_page(path, command):
    text = _text(DOCS / "cli.md")
    assert path[-1] in text, f"docs/cli.md does not mention the command {' '.join(path)!r}"
    for param in command.params:
        for opt in [*param.opts, *param.secondary_opts]:
            shown = opt if opt.startswith("-") else opt.upper()  # arguments appear as DIRECTORY
            assert shown in text, f"docs/cli.md does not mention {shown} of `sklearn-gpu-bridge {' '.join(path)}`"


def test_the_groups_own_options_are_in_the_cli_page():
    text = _text(DOCS / "cli.md")
    for param in main.params:
        for opt in param.opts:
            assert opt in text, opt


# (c) the README's size and every relative link


def test_the_readme_is_short():
    lines = len(_text(README).splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page):
    broken = []
    for target in _relative_links(page):
        file_part, _, anchor = target.partition("#")
        goal = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not goal.exists():
            broken.append(f"{target}: no such file")
        elif anchor and goal.suffix == ".md" and anchor not in _anchors(goal):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_pages_link_to_each_other():
    """docs/index.md lists every page of docs/, and the README links to the index."""
    index = _text(DOCS / "index.md")
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "index.md" and f"({p.name}" not in index]
    assert not missing, f"docs/index.md does not link to {missing}"
    assert "(docs/index.md)" in _text(README)


# (d) the README's two commands


@pytest.mark.parametrize("command", [DEMO, TESTS], ids=["demo", "tests"])
def test_the_readme_gives_the_two_commands_verbatim(command):
    lines = [line.strip() for line in _text(README).splitlines()]
    assert command in lines, f"README.md lacks, on a line of its own: {command}"


def test_the_demo_command_exists():
    assert "demo" in main.commands


# (e) the README's install steps and Python snippets, as a new user meets them


def _readme_blocks(language):
    return re.findall(rf"^```{language}\n(.*?)^```", _text(README), re.MULTILINE | re.DOTALL)


def test_the_readme_installs_client_and_worker_from_a_checkout_each_in_a_virtualenv():
    """The package is not on PyPI: every install command runs in a checkout's top folder, in a virtualenv."""
    assert "not published on PyPI" in _text(README)
    blocks = [b for b in _readme_blocks("bash") if "pip install" in b]
    assert any(".[worker-cu13]" in b for b in blocks), "README.md does not say how to install the GPU worker"
    for block in blocks:
        lines = block.splitlines()
        pip = next(i for i, line in enumerate(lines) if "pip install" in line)
        assert "python3 -m venv" in "\n".join(lines[:pip + 1]), f"no virtualenv before pip install in:\n{block}"
        if ".[worker" in block:  # on another machine than the client's: first into a checkout there
            assert any(re.match(r"(git clone .* && )?cd \S", line) for line in lines[:pip]), \
                f"README.md's worker install does not start in a checkout:\n{block}"


SNIPPETS = _readme_blocks("python")


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_each_python_snippet_of_the_readme_runs_alone(snippet, worker, tmp_path):
    """As the README says to run it: code that imports the bridge with python, unchanged scikit-learn or cuML code
    under ``python -m sklearn_gpu_bridge.accel``; each in a fresh process, in an empty folder."""
    assert len(SNIPPETS) >= 3
    (tmp_path / "snippet.py").write_text(snippet)
    accel = [] if re.search(r"^(from|import) sklearn_gpu_bridge\b", snippet, re.MULTILINE) else [
        "-m", "sklearn_gpu_bridge.accel"]
    env = {**os.environ, config.ENV_CONNECTION_FILE: str(worker.connection_file),
           config.ENV_PREFIX + "LOCAL_BACKEND": "sklearn"}
    run = subprocess.run([sys.executable, *accel, "snippet.py"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip(), "the snippet printed nothing"
