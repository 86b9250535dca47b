"""ampify's pre-commit hooks (.pre-commit-hooks.yaml), run by pre-commit itself against a small git
repository (#21 item 2): `pre-commit try-repo` installs ampify from this checkout into the hook's
own environment, as a user's `.pre-commit-config.yaml` would."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pre_commit")

ROOT = Path(__file__).resolve().parent.parent
DEPRECATED = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _try_hook(repo: Path, hook: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(home), PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), hook, "--all-files"],
                          cwd=repo, capture_output=True, text=True, timeout=600, env=env)


def test_check_hook_fails_and_rewrite_hook_fixes_the_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "ci")
    (repo / "train.py").write_text(DEPRECATED)
    (repo / "README.md").write_text("not python\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a training script")
    home = tmp_path / "pre-commit-home"

    check = _try_hook(repo, "ampify-check", home)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "ampify (check)" in check.stdout and "Failed" in check.stdout
    assert "train.py:3:6: AMP401" in check.stdout
    assert (repo / "train.py").read_text() == DEPRECATED  # a check writes nothing

    rewrite = _try_hook(repo, "ampify", home)
    assert rewrite.returncode == 1 and "files were modified by this hook" in rewrite.stdout, rewrite.stdout
    assert 'with torch.amp.autocast("cuda"):' in (repo / "train.py").read_text()

    _git(repo, "commit", "-q", "-am", "migrated")
    again = _try_hook(repo, "ampify-check", home)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ampify (check)" in again.stdout and "Passed" in again.stdout
