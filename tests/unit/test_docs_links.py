"""Every relative link in the project's Markdown files points at a file of the
repository: no page may lead outside it (a clone has nothing beside it)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_markdown():
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.split()]


def test_relative_links_stay_inside_the_repository_and_exist():
    files = tracked_markdown()
    assert any(f.name == "README.md" for f in files)
    bad = []
    for md in files:
        for target in LINK.findall(md.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (md.parent / target.split("#", 1)[0]).resolve()
            if ROOT not in path.parents and path != ROOT:
                bad.append(f"{md.relative_to(ROOT)} -> {target} (outside the repository)")
            elif not path.exists():
                bad.append(f"{md.relative_to(ROOT)} -> {target} (missing)")
    assert not bad, "\n".join(bad)


def test_no_file_refers_to_the_folder_beside_the_repository():
    out = subprocess.run(["git", "grep", "-l", "-F", "../shared", "--", ":!tests/unit/test_docs_links.py"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    assert out == "", out
