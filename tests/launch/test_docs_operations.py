"""docs/operations.md lists every configuration field, its variable and the
Horovod variables honoured, so the table cannot fall behind the code; it is the
one table of the fields (the README links to it)."""

from dataclasses import fields

from procs import ROOT

from hvd_partial.config import ENV_PREFIX, Config
from hvd_partial.config_env import HOROVOD_VARIABLES
from hvd_partial.launch.cli import build_parser

DOC = (ROOT / "docs" / "operations.md").read_text()
README = (ROOT / "README.md").read_text()


def _table_rows():
    return [line for line in DOC.splitlines() if line.startswith("| `")]


def test_every_field_has_a_row_with_its_variable_and_default():
    rows = _table_rows()
    for f in fields(Config):
        row = next((r for r in rows if r.startswith(f"| `{f.name}` |")), None)
        assert row is not None, f"docs/operations.md has no row for {f.name}"
        assert f"`{ENV_PREFIX}{f.name.upper()}`" in row
        default = {"": "''", True: "true", False: "false"}.get(f.default, str(f.default)) \
            if not isinstance(f.default, (int, float)) or isinstance(f.default, bool) else f"{f.default}"
        assert default in row, (f.name, default, row)


def test_every_row_of_the_table_is_a_field():
    names = {f.name for f in fields(Config)}
    for row in _table_rows():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) > 1 and cells[1].startswith(f"`{ENV_PREFIX}"):
            name = cells[0].strip("`")
            assert name in names, f"docs/operations.md documents {name}, which Config does not have"
            assert cells[1] == f"`{ENV_PREFIX}{name.upper()}`", row


def test_the_readme_keeps_no_second_table_of_the_fields():
    names = {f.name for f in fields(Config)}
    copied = [line for line in README.splitlines()
              if line.startswith("| `") and line[3:].split("`", 1)[0] in names]
    assert not copied, copied
    assert "docs/operations.md" in README


def test_every_horovod_variable_and_launcher_flag_is_documented():
    for variable in HOROVOD_VARIABLES:
        assert f"`{variable}" in DOC, variable
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and action.help != "==SUPPRESS==" and flag not in ("--help", "--num-proc",
                                                                                         "--hosts"):
                assert f"`{flag}" in DOC, flag
