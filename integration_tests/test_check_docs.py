"""scripts/check_docs.py, which scripts/build_docs.sh runs before `mdbook build`: it passes on the
repository's book and fails, naming the problem, on a copy with a broken link, anchor or include, a page
missing from SUMMARY.md, a quoted error message the code no longer has, or a client variable the page
does not list. A few seconds (a copy of the checkout, about 4 MB, per case); starts no server."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "check_docs.py"


def repository_files() -> list[str]:
    """The checkout's files (committed or not, without the ignored ones: builds, venvs, docs/book)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the checkout's files (about 4 MB), for the check to find its problems in."""
    for name in repository_files():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_the_repositorys_book_passes():
    result = check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all resolve" in result.stdout


def test_a_sound_copy_passes(copy: Path):
    result = check(copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", ["link", "anchor", "include", "summary", "quote", "variable", "readme"])
def test_each_kind_of_problem_fails_and_is_named(copy: Path, case: str):
    src = copy / "docs" / "src"
    if case == "link":
        edit(src / "operator" / "running.md", "(restarts.md)", "(restart.md)")
        expected = "link restart.md: no docs/src/operator/restart.md"
    elif case == "anchor":
        edit(src / "user" / "tokens.md", "#token-and-identity-refusals-unauthenticated", "#token-refusals")
        expected = "no heading #token-refusals"
    elif case == "include":
        edit(src / "operator" / "slurm.md", "deploy/slurm/README.md", "deploy/slurm/MISSING.md")
        expected = "{{#include ../../../deploy/slurm/MISSING.md:2:}}: no file"
    elif case == "summary":
        (src / "user" / "orphan.md").write_text("# Orphan\n")
        expected = "docs/src/user/orphan.md: not listed in docs/src/SUMMARY.md"
    elif case == "quote":
        edit(copy / "node" / "src" / "runtime" / "settings.rs", "this node is draining for maintenance",
             "this node is being drained")
        expected = "'this node is draining for maintenance"
    elif case == "variable":
        (copy / "python" / "src" / "salus" / "_new.py").write_text('ENV = "SALUS_NEW_SETTING"\n')
        expected = "SALUS_NEW_SETTING is read in"
    else:
        edit(copy / "README.md", "(docs/src/user/tf2.md)", "(docs/src/user/tf3.md)")
        expected = "README.md: link docs/src/user/tf3.md: no such file"
    result = check(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert expected in result.stdout, result.stdout
