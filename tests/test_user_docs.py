"""The user docs: the README is a user's guide of about 250 lines whose "two commands"
are two, the second the one CI runs; README and docs/ name no issue numbers and link
only to files that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no section '## {title}'"
    return match.group(1)


def test_the_readme_is_a_short_users_guide():
    assert len(README.splitlines()) <= 250, "README.md: keep it a guide; details go to docs/"
    for title in ("Set-up: two commands", "A tour of the magics", "Common tasks",
                  "Where the notebooks are", "When a rank fails", "Troubleshooting"):  # fmt: skip
        assert _section(README, title).strip(), title
    for doc in ("docs/GUIDE.md", "docs/ARCHITECTURE.md", "docs/CONTRIBUTING.md"):
        assert f"]({doc}" in README, f"the README does not link {doc}"


def test_two_commands_are_two_and_the_second_is_what_ci_runs():
    commands = re.findall(
        r"^```bash\n(.*?)\n```", _section(README, "Set-up: two commands"), re.S | re.M
    )
    assert len(commands) == 2, commands
    first, second = commands
    assert "\n" not in first and "\n" not in second, commands
    # the first installs JupyterLab too ([lab]) and ends in the quick start
    assert ".venv/bin/pip install -c constraints.txt -e '.[lab]'" in first, first
    assert first.endswith(" && .venv/bin/clusterkernel-quickstart"), first
    ci = [line for line in (REPO / ".ci/run").read_text().splitlines() if line.strip()]
    assert ci[-1] == second, ".ci/run's command and the README's second command differ"


def test_user_docs_name_no_issue_numbers():
    for path in USER_DOCS:
        found = re.findall(r"\bissues? #?\d+", path.read_text(), re.I)  # "#57" is a call number
        assert not found, f"{path.relative_to(REPO)} refers to {found}: readers cannot see them"


def test_relative_links_in_user_docs_reach_files():
    for path in USER_DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(REPO)} links {target}"
