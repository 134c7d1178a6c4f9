"""docs/operations.md lists every configuration field, its variable and the
Horovod variables honoured, so the table cannot fall behind the code."""

from dataclasses import fields

from procs import ROOT

from hvd_partial.config import ENV_PREFIX, Config
from hvd_partial.config_env import HOROVOD_VARIABLES
from hvd_partial.launch.cli import build_parser

DOC = (ROOT / "docs" / "operations.md").read_text()


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


def test_every_horovod_variable_and_launcher_flag_is_documented():
    for variable in HOROVOD_VARIABLES:
        assert f"`{variable}" in DOC, variable
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and action.help != "==SUPPRESS==" and flag not in ("--help", "--num-proc",
                                                                                         "--hosts"):
                assert f"`{flag}" in DOC, flag
