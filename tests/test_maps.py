"""The maps are complete: every module under gateway/ and engine/ is named in the README's layout
or in docs/architecture.md's "Finding your way" (issue 26). A new module named in neither fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "engine")
MODULE = re.compile(r"`([\w/]+\.py)`")


def modules(root: Path = ROOT) -> set[str]:
    return {str(path.relative_to(root)) for package in PACKAGES for path in (root / package).rglob("*.py")
            if path.name != "__init__.py"}


def section(text: str, heading: str) -> str:
    """The text of a markdown section, up to the next heading of its level or above."""
    start = text.index(heading)
    level = heading.split(" ")[0]
    rest = text[start + len(heading):]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.M)]
    return rest[:ends[0]] if ends else rest


def readme_layout_names(readme: str) -> set[str]:
    """Paths the README's layout tree names: a line's name column (before two spaces) at an indent of
    two spaces a level, folders ending in `/`; description lines further in name nothing."""
    block = section(readme, "## Layout").split("```")[1]
    names, folders = set(), []
    for line in block.splitlines():
        match = re.match(r"^( *)(\S.*?)(?: {2,}|$)", line)
        if not match or len(match[1]) > 6:
            continue
        level = len(match[1]) // 2
        folders = folders[:level]
        for entry in (e.strip() for e in match[2].split(",")):
            if entry.endswith("/") and "," not in match[2]:
                folders.append(entry.rstrip("/"))
            elif entry.endswith(".py"):
                names.add("/".join([*folders, entry]))
    return names


def finding_your_way_names(architecture: str) -> set[str]:
    """Full paths named in the section, and in its module table `folder/` rows, each `name.py` of the row."""
    text = section(architecture, "## Finding your way")
    names = {name for name in MODULE.findall(text) if name.startswith(PACKAGES)}
    for row in re.finditer(r"^\| `([\w/]+/)` \|(.*)\|$", text, re.M):
        names |= {row[1] + name for name in MODULE.findall(row[2]) if "/" not in name}
    return names


def unnamed(found: set[str], readme: str, architecture: str) -> list[str]:
    named = readme_layout_names(readme) | finding_your_way_names(architecture)
    return sorted(found - named)


def test_every_module_is_named_in_the_readme_layout_or_in_finding_your_way() -> None:
    missing = unnamed(modules(), (ROOT / "README.md").read_text(), (ROOT / "docs/architecture.md").read_text())
    assert not missing, f"name these in README's Layout or docs/architecture.md's Finding your way: {missing}"


def test_a_module_named_in_neither_map_is_found() -> None:
    readme, architecture = (ROOT / "README.md").read_text(), (ROOT / "docs/architecture.md").read_text()
    newcomer = "gateway/pipeline/newcomer.py"
    assert unnamed(modules() | {newcomer}, readme, architecture) == [newcomer]


def test_the_readme_tree_is_read_by_its_folders() -> None:
    readme = "## Layout\n```\ngateway/   the gateway\n  app.py    factory\n  auth/     tokens\n    jwks.py  keys\n" \
             "                     jwks.py in a description names nothing\nengine/\n  cli.py\n```\n"
    assert readme_layout_names(readme) == {"gateway/app.py", "gateway/auth/jwks.py", "engine/cli.py"}
