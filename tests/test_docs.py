"""The README documents every command the CLI has, and every command has help."""
from __future__ import annotations

import pytest

from tests.conftest import REPO
from tuner.cli import build_parser

SUB = build_parser()._subparsers._group_actions[0]  # noqa: SLF001 - argparse has no public walk
README = (REPO / "README.md").read_text()


@pytest.mark.parametrize("cmd", sorted(SUB.choices))
def test_every_command_is_in_the_readme(cmd):
    assert f"tuner {cmd}" in README


@pytest.mark.parametrize("cmd", sorted(SUB.choices))
def test_every_command_has_help(cmd):
    helps = {a.dest: a.help for a in SUB._choices_actions}  # noqa: SLF001
    assert helps.get(cmd)


def test_readme_defines_its_nouns_before_any_command():
    nouns = README.index("## Nouns")
    first_command = README.index("```bash")
    for noun in ("Campaign", "Shape", "Lever", "Arm", "Incumbent", "Depth", "Verdict", "Journal", "Promotion"):
        assert nouns < README.index(f"**{noun}**") < first_command
