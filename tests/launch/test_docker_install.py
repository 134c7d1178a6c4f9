"""The Dockerfiles install hvd_partial with the tested command: the one that
.ci/run (CI) and the README run. Docker cannot build here, so this is what
keeps the images from drifting."""

import re
import shlex

import pytest

from procs import ROOT

DOCKERFILES = ["ci/docker/Dockerfile.cpu", "ci/docker/Dockerfile.gpu"]


def _pip_installs(text: str) -> list[list[str]]:
    """Every ``pip install`` command in shell text, as normalized word lists
    (``python -m`` and quiet flags dropped)."""
    out = []
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        for part in re.split(r"&&|;", line):
            try:
                words = shlex.split(part)
            except ValueError:  # prose with an apostrophe, not a command
                continue
            if words and words[0] == "RUN":
                words = words[1:]
            if words[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
                words = ["pip"] + words[3:]
            if words[:2] == ["pip", "install"]:
                out.append([w for w in words if w not in ("-q", "--quiet")])
    return out


def _tested_install() -> list[str]:
    installs = _pip_installs((ROOT / ".ci" / "run").read_text())
    assert len(installs) == 1, installs
    return installs[0]


def test_ci_installs_from_the_pinned_requirements():
    assert _tested_install() == ["pip", "install", "-r", "ci/requirements.txt", "-e", "."]
    assert (ROOT / "ci" / "requirements.txt").exists()


def test_readme_shows_the_tested_install():
    assert _tested_install() in _pip_installs((ROOT / "README.md").read_text())


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_installs_with_the_tested_command_from_the_copied_repo(dockerfile):
    text = (ROOT / dockerfile).read_text()
    installs = _pip_installs(text)
    assert installs and installs[0] == _tested_install(), installs
    # The repository is copied before the install, into the working directory it runs in.
    assert text.index("COPY . .") < text.index("pip install -r ci/requirements.txt -e .")
    assert re.search(r"^WORKDIR /opt/hvd_partial$", text, re.M)
    # Anything installed after the tested step is the GPU framework swap, named as untested.
    for extra in installs[1:]:
        assert any(w.startswith("tensorflow[and-cuda]") for w in extra), extra
        assert "untested" in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_build_context_leaves_out_virtualenvs_and_git(dockerfile):
    # BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile; the build context is the root.
    ignore = (ROOT / f"{dockerfile}.dockerignore").read_text().split()
    for pattern in (".git", ".venv", "venv", "*.egg-info", "**/__pycache__", "build", "dist"):
        assert pattern in ignore, pattern
