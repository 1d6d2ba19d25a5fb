"""What the docs site and the README tell a reader to type or open exists: every ``kfloop`` command and flag in their
code is one the real parser has, and every repository path they name is in the checkout (or is a build output the
checkout ignores)."""
from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from pipelines.cli.commands import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
FOLDERS = ("deploy", "pipelines", "components", "training", "monitoring", "data", "benchmarks", "examples", "tests",
           "docs", ".github", ".ci")
PATH = re.compile(r"(?<![\w./:@-])(?:\.\./)*((?:" + "|".join(re.escape(f) for f in FOLDERS) + r")/[\w./-]*\w)")
"""A repository path: one of the top-level folders, then more (``deploy/rbac.yaml``, ``../deploy/e2e.sh``); not a
part of a URL or of another path (``s3://bucket/data/x``)."""
CODE = re.compile(r"```(\w*)[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)
COMMAND_START = re.compile(r"^\s*(?:\$\s+)?(?:[A-Za-z_]\w*=\S*\s+)*(?:\S*/)?(?:kfloop|python -m pipelines)(?=\s|$)")
"""A command line that runs kfloop: after a prompt, variable assignments and a directory (``.venv/bin/``)."""
SEPARATOR = re.compile(r"&&|\|\||;|\||\$\(|\s#.*")
PLACEHOLDER = re.compile(r"^(\.\.\.|\[.*|\{.*|[A-Z][A-Z_|]*|.*\.\.\.)$")
"""A word that stands for something (``COMMAND``, ``...``, ``[--json]``, ``{a,b}``), not a word to type."""


def _code(text: str) -> list[str]:
    """The code in a page: fenced blocks other than ``text`` (a program's output), with ``\\`` line continuations
    joined, and inline code spans."""
    return [(block or span).replace("\\\n", " ") for lang, block, span in CODE.findall(text) if lang != "text"]


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def check_invocation(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What in one ``kfloop`` invocation (the words after ``kfloop``) the parser does not have."""
    problems, top, current = [], _options(parser), parser
    expects_value, given = False, 0
    for word in words:
        if PLACEHOLDER.match(word):
            if current is parser and not expects_value:
                break  # the command itself is a placeholder (`kfloop COMMAND ...`)
            expects_value = False
            continue
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            action = _options(current).get(flag) or top.get(flag)
            if action is None:
                problems.append(f"{current.prog}: no flag {flag}")
            expects_value = action is not None and action.nargs != 0 and "=" not in word
        elif expects_value or word.startswith("-"):
            expects_value = False
        elif word in _subcommands(current):
            current, given = _subcommands(current)[word], 0
        elif current is parser:
            problems.append(f"kfloop: no command {word!r}")
            break
        else:  # a positional argument: one of its choices where it has some (`kfloop run training`)
            positionals = [a for a in current._actions if not a.option_strings]
            if given < len(positionals) and positionals[given].choices and word not in positionals[given].choices:
                problems.append(f"{current.prog}: {word!r} is not one of {sorted(positionals[given].choices)}")
            given += 1
    return problems


def invocations(text: str) -> list[list[str]]:
    """The word lists of every ``kfloop`` (or ``python -m pipelines``) invocation in a page's code: a command at
    the start of a line or after ``&&``, ``;``, ``|``, ``$(``; comments and output lines (``kfloop demo: ...``) left
    out."""
    found = []
    for code in _code(text):
        for line in code.splitlines():
            for command in SEPARATOR.split(line):
                start = COMMAND_START.match(command or "")
                words = command[start.end():].split() if start else []
                if words and not words[0].endswith(":"):
                    found.append(words)
    return found


def repository_paths(text: str) -> set[str]:
    return {path.rstrip(".") for path in PATH.findall(text)}


def _ignored(path: str) -> bool:
    """Whether git ignores ``path`` (a build or run output, such as the demo data ``dvc repro`` writes)."""
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO).returncode == 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_documented_commands_and_flags_exist(page):
    parser = build_parser()
    problems = {problem for words in invocations(page.read_text()) for problem in check_invocation(words, parser)}
    assert not problems, f"{page.relative_to(REPO)} documents what kfloop does not have: {sorted(problems)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_documented_paths_exist(page):
    missing = sorted(path for path in repository_paths(page.read_text())
                     if not (REPO / path).exists() and not _ignored(path))
    assert not missing, f"{page.relative_to(REPO)} names paths the repository does not have: {missing}"


def test_the_checks_catch_what_they_are_for():
    parser = build_parser()
    (good,) = invocations("```bash\nkfloop --workdir W drift --reference a.csv \\\n  --current b.csv --json\n```")
    assert check_invocation(good, parser) == []
    assert check_invocation(invocations("`kfloop VERSION (commit SHA)`")[0], parser) == []
    (typo,) = invocations("run `kfloop drfit --json`")
    assert check_invocation(typo, parser) == ["kfloop: no command 'drfit'"]
    (pipeline,) = invocations("`kfloop run trainig --local`")
    assert check_invocation(pipeline, parser) == ["kfloop run: 'trainig' is not one of ['drift', 'quality', 'training']"]
    (old,) = invocations("`kfloop run training --local --nope 3`")
    assert check_invocation(old, parser) == ["kfloop run: no flag --nope"]
    assert invocations("```bash\nkubectl -n kfloop get pods  # kfloop reads\nX=1 .venv/bin/kfloop status\n```") == \
        [["status"]]
    assert repository_paths("see deploy/rbac.yaml, ../deploy/e2e.sh and s3://bucket/data/x.csv") == \
        {"deploy/rbac.yaml", "deploy/e2e.sh"}
