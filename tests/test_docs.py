"""The generated reference pages (docs/reference/) are what docs/generate.py writes from the code today."""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


@pytest.mark.parametrize("path", sorted(generate.PAGES), ids=lambda p: p.name)
def test_generated_page_is_fresh(path):
    assert path.read_text() == generate.PAGES[path](), \
        f"{path.relative_to(REPO)} is stale: run `python docs/generate.py` and commit the result"


def test_settings_page_lists_every_section_and_field():
    page = generate.settings_page()
    for section, cls in generate.SECTIONS.items():
        assert f"## `{section}`" in page
    assert "| `epochs` | `int` | `8` |" in page  # a TrainingConfig field, merged into `training`
    assert "| `nnodes` | `int` | `1` |" in page  # a JobShape field, merged into `training` as well
    assert "| `launcher.restart_cap` | `int` | `3` |" in page  # LaunchPolicy sits under `cluster.launcher`
    # allowed values read from __post_init__ and from Literal types
    assert re.search(r"\| `kind` \| `str` \| `\"pytorchjob\"` \| `\"pytorchjob\"`, `\"trainjob\"`, `\"rayjob\"` \|", page)
    assert '`"summary"`, `"evidently_sample"`, `"evidently_full"`' in page
    # field docstrings (the string literal under a field)
    assert "AdamW learning rate at epoch 0." in page
    assert "### `drift.column_overrides` entries: `ColumnDriftOverride`" in page


def test_cli_page_lists_every_command_and_flag():
    page = generate.cli_page()
    parser = generate.build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    for name, sub in commands.choices.items():
        assert f"## kfloop {name}\n" in page
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in page.split(f"## kfloop {name}\n")[1].split("\n## ")[0], (name, flag)


def test_field_docstrings_come_from_the_source():
    @dataclass
    class Probe:
        a: int = 1
        """first"""
        b: int = 2
        c: int = 3
        """third"""

    assert generate.field_docstrings(Probe) == {"a": "first", "c": "third"}


def test_settings_page_renders_cleanly():
    """No escaped pipe (a type union is "or"), no raw Sphinx role, every top-level key described."""
    page = generate.settings_page()
    assert "\\|" not in page
    assert re.findall(r":\w+:`", page) == []
    assert "``" not in page  # reST double backticks became Markdown code
    assert "| `primary_metric` | `str` or `None` |" in page
    top = page.split("## Top-level keys")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in top.splitlines() if line.startswith("| `")]
    assert {row[0].strip("| `") for row in rows} >= {"dataset_uri", "model_name", "training_pipeline_version"}
    assert all(row[-1].strip(" |") for row in rows)  # a description in every row
    # a :data: role naming a constant lists what it holds
    assert "`METRICS` (`accuracy`, `f1_macro`, `roc_auc`, `log_loss`)" in page
    assert "relative to the folder of the `kfloop.yaml` that names it" in page


def test_exit_codes_page_is_the_table_and_troubleshooting_shows_it():
    page = generate.exit_codes_page()
    for code, kind in generate.EXIT_CODES.items():
        assert f"| `{code}` | {kind} |" in page
    assert '--8<-- "reference/exit-codes.md"' in (REPO / "docs" / "troubleshooting.md").read_text()
