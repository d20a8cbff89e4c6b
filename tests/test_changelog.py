"""The version moves with the changelog: pyproject, the package and CHANGELOG.md's newest heading agree."""

import re
import tomllib
from pathlib import Path

import budgeted_attention

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_the_changelogs_newest():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## (\d+\.\d+\.\d+)\b", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings, "CHANGELOG.md has no '## X.Y.Z' version heading"
    assert project == budgeted_attention.__version__ == headings[0], (
        f"pyproject.toml says {project}, budgeted_attention.__version__ {budgeted_attention.__version__}, "
        f"CHANGELOG.md's newest heading {headings[0]}"
    )
    versions = [tuple(map(int, v.split("."))) for v in headings]
    assert versions == sorted(versions, reverse=True), f"CHANGELOG.md headings are not newest first: {headings}"
