"""The candidate-commit definition and the clean-tree check, in a temp git repository."""

from __future__ import annotations

from pathlib import Path

from ckptgate.evidence.candidate import candidate_commit, dirty_paths, tree_is_clean
from evidence_helpers import commit_all, git


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    return repo


def test_evidence_commits_never_name_themselves(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "code.py").write_text("a = 1\n")
    commit_all(repo, "c1")
    (repo / "code.py").write_text("a = 2\n")
    c2 = commit_all(repo, "c2 code")
    (repo / "attestations").mkdir()
    (repo / "attestations" / "x.json").write_text("{}\n")
    commit_all(repo, "c3 evidence")
    (repo / "matrix").mkdir()
    (repo / "matrix" / "SUPPORT.md").write_text("m\n")
    commit_all(repo, "c4 matrix")
    assert candidate_commit(repo) == c2


def test_any_other_change_moves_the_candidate_to_head(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "code.py").write_text("a = 1\n")
    commit_all(repo, "c1")
    (repo / "attestations").mkdir()
    (repo / "attestations" / "x.json").write_text("{}\n")
    commit_all(repo, "c2 evidence")
    (repo / "docs.md").write_text("new\n")
    head = commit_all(repo, "c3 docs")
    assert candidate_commit(repo) == head


def test_nested_matrix_dir_is_code(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "code.py").write_text("a = 1\n")
    commit_all(repo, "c1")
    (repo / "src" / "matrix").mkdir(parents=True)
    (repo / "src" / "matrix" / "m.py").write_text("x\n")
    head = commit_all(repo, "c2 nested matrix dir is code")
    assert candidate_commit(repo) == head


def test_first_commit_is_its_own_candidate(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "code.py").write_text("a = 1\n")
    head = commit_all(repo, "c1")
    assert candidate_commit(repo) == head


def test_dirty_paths_see_modified_and_untracked_but_not_ignored(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "code.py").write_text("a = 1\n")
    (repo / ".gitignore").write_text("build/\n")
    commit_all(repo, "c1")
    assert tree_is_clean(repo)
    (repo / "build").mkdir()
    (repo / "build" / "x").write_text("ignored\n")
    assert tree_is_clean(repo)
    (repo / "code.py").write_text("a = 2\n")
    (repo / "new.txt").write_text("n\n")
    (repo / "attestations").mkdir()
    (repo / "attestations" / "a.json").write_text("{}\n")
    assert dirty_paths(repo) == ["attestations/a.json", "code.py", "new.txt"]
    assert dirty_paths(repo, exclude=("attestations",)) == ["code.py", "new.txt"]
