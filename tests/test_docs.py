"""The README is part of the product: its two commands and its settings table must stay true."""

import re
from pathlib import Path

from engram.domain import auth
from engram.settings import Settings

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make up", "make test"]
    assert README.index("make up") < README.index("## ")


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_setting_is_in_the_configuration_table():
    table = README.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([A-Z0-9_]+)`", table))
    missing = sorted(name.upper() for name in Settings.model_fields if name.upper() not in documented)
    assert not missing, f"settings missing from the README's configuration table: {missing}"
    unknown = sorted(n for n in documented if n.lower() not in Settings.model_fields and not n.isdigit())
    assert not unknown, f"README documents settings the code does not read: {unknown}"


def test_the_readmes_roles_table_is_the_permission_matrix():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| action | reader | agent | writer | operator | admin |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.strip().splitlines()[1:] if line.startswith("|")]
    documented = {role: set() for role in auth.ROLES}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for role, cell in zip(("reader", "agent", "writer", "operator", "admin"), cells[1:]):
            if cell == "✓":
                documented[role].add(cells[0])
    assert {role: set(actions) for role, actions in auth.PERMISSIONS.items()} == documented
    assert [row.strip("|").split("|")[0].strip() for row in rows] == list(auth.ACTIONS)
