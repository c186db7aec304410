"""The repository stands on its own: its documents name no file outside it, and its results
folders hold summaries, not per-sample dumps."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (these tests read the tracked files)")
    return [REPO / p for p in out.decode().split("\0") if p]


def _documents() -> list[Path]:
    """What a reader follows: Markdown, shell scripts, configs, and the benchmark scripts (their
    docstrings are their usage)."""
    return [p for p in _tracked() if p.suffix in (".md", ".sh", ".toml")
            or (p.suffix == ".py" and p.relative_to(REPO).parts[0] in ("benchmarks", "scripts"))]


RELATIVE = re.compile(r"(?<![\w/.<])((?:\.\./)+[\w.-][\w./-]*)")  # ../x, ../../y (not '#include <../..>')
ABSOLUTE = re.compile(r"(?<![\w.~$])/(?:work|home|root|mnt|data)/[\w./-]+")


def _points_inside(doc: Path, path: str) -> bool:
    """A Markdown link or mention is read from the document's folder and must name something in
    the repository; a path in a script or a usage line is read from the repository root (where
    the commands run) and must stay in it."""
    root = REPO.resolve()
    if doc.suffix == ".md":
        target = (doc.parent / path).resolve()
        return target.is_relative_to(root) and target.exists()
    return (root / path).resolve().is_relative_to(root)


def test_documents_name_no_file_outside_the_repository() -> None:
    """A session README said the matrices came from '../shared/matrices/suitesparse' and a
    benchmark's usage passed that path: a fresh clone has no such folder."""
    found = []
    for doc in _documents():
        text = doc.read_text(errors="replace")
        found += [f"{doc.relative_to(REPO)}: {m.group(1)}" for m in RELATIVE.finditer(text)
                  if not _points_inside(doc, m.group(1))]
        found += [f"{doc.relative_to(REPO)}: {m.group(0)}" for m in ABSOLUTE.finditer(text)]
    assert found == []


def test_results_folders_hold_summaries_not_per_sample_dumps() -> None:
    """benchmarks/results keeps tables, summaries, small logs and plots; the per-sample dumps
    (completions.jsonl, per-matrix records: hundreds of KB to MB each) are regenerated, not kept
    (benchmarks/results/README.md says how)."""
    results = [p for p in _tracked() if p.relative_to(REPO).parts[:2] == ("benchmarks", "results")]
    assert results, "no tracked results"
    assert [p.name for p in results if p.name == "completions.jsonl"] == []
    big = [f"{p.relative_to(REPO)} ({p.stat().st_size // 1024} KB)" for p in results
           if p.exists() and p.stat().st_size > 200 * 1024]
    assert big == []


def test_shell_scripts_parse() -> None:
    """The scripts/ recipes run on the GPU machine only; a syntax error there costs a device call."""
    scripts = [p for p in _tracked() if p.suffix == ".sh"]
    assert any(p.name == "improve_round.sh" for p in scripts)
    bad = {}
    for p in scripts:
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        if r.returncode:
            bad[str(p.relative_to(REPO))] = r.stderr.strip()
    assert bad == {}
