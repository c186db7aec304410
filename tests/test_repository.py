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
    """A results README said the matrices came from '../shared/matrices/suitesparse' and a
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


MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RESULTS_PATH = re.compile(r"`(benchmarks/results/[^`\s*]*)`")


def test_markdown_links_and_results_paths_resolve() -> None:
    """Every relative Markdown link, and every `benchmarks/results/...` path a document names,
    points at a tracked file or folder. Kills the mutation 'rename a results folder (or a doc)
    and leave the README, docs/results.md or a folder README pointing at the old name'."""
    tracked = _tracked()
    names = {p.relative_to(REPO).as_posix() for p in tracked}
    folders = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    found = []
    for doc in [p for p in tracked if p.suffix == ".md"]:
        text = doc.read_text(errors="replace")
        base = doc.parent.relative_to(REPO)
        links = [m.group(1) for m in MD_LINK.finditer(text) if not re.match(r"[a-z]+:", m.group(1))]
        for link in links:
            target = (REPO / base / link).resolve()
            rel = target.relative_to(REPO.resolve()).as_posix() if target.is_relative_to(REPO.resolve()) else None
            if rel not in names and rel not in folders:
                found.append(f"{doc.relative_to(REPO)}: ({link})")
        for m in RESULTS_PATH.finditer(text):
            path = m.group(1).rstrip("/")
            if path not in names and path not in folders:
                found.append(f"{doc.relative_to(REPO)}: `{m.group(1)}`")
    assert found == []


def test_results_folders_keep_no_raw_logs() -> None:
    """Raw run logs stay out of git (each folder's README holds what they showed; .gitignore
    drops them). Kills the mutation 'commit a run's *.log into benchmarks/results'."""
    logs = [p.relative_to(REPO).as_posix() for p in _tracked()
            if p.relative_to(REPO).parts[:2] == ("benchmarks", "results") and p.suffix == ".log"]
    assert logs == []


HISTORY = re.compile(r"session ?[0-9]|issue ?[0-9]|sessions? (one|two|three|four|five|six|seven|eight|nine|ten"
                     r"|eleven|twelve)", re.IGNORECASE)


def test_documents_speak_of_the_project_not_of_how_it_was_made() -> None:
    """The README, docs/, scripts/, benchmarks/ (results included) and configs/ name no session or
    issue numbers, in their text or their paths. Kills the mutation 'a results folder named after
    the work session that made it' or 'a README line citing an issue's number for its targets'."""
    found = []
    for p in _tracked():
        rel = p.relative_to(REPO)
        if not (rel.as_posix() == "README.md" or rel.parts[0] in ("docs", "scripts", "benchmarks", "configs")):
            continue
        if HISTORY.search(rel.as_posix()):
            found.append(rel.as_posix())
        elif p.suffix in (".md", ".py", ".sh", ".toml", ".json", ".txt") and p.exists():
            found += [f"{rel}: {m.group(0)}" for m in HISTORY.finditer(p.read_text(errors="replace"))]
    assert found == []


def test_source_and_tests_speak_of_the_project_not_of_how_it_was_made() -> None:
    """src/ and tests/ (this file's pattern aside) name no session or issue numbers, in their text
    or their paths. Kills the mutation 'a docstring citing the issue that asked for its feature'."""
    found = []
    for p in _tracked():
        rel = p.relative_to(REPO)
        if rel.parts[0] not in ("src", "tests") or rel.as_posix() == "tests/test_repository.py":
            continue
        if HISTORY.search(rel.as_posix()):
            found.append(rel.as_posix())
        elif p.suffix in (".py", ".md", ".cu", ".toml", ".txt") and p.exists():
            found += [f"{rel}: {m.group(0)}" for m in HISTORY.finditer(p.read_text(errors="replace"))]
    assert found == []


def test_every_source_folder_is_a_package() -> None:
    """Every folder of src/sparserl holding Python files has an __init__.py, so that setuptools'
    find_packages installs it. Kills the mutation 'a new subpackage without __init__.py', which
    imports from a checkout (a namespace package) and is missing from a built wheel."""
    src = REPO / "src" / "sparserl"
    missing = sorted(str(d.relative_to(REPO)) for d in {p.parent for p in src.rglob("*.py")}
                     if not (d / "__init__.py").exists())
    assert missing == []
