"""``sparserl corpus build`` and ``sparserl corpus pack``."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(help="The CUDA pre-training corpus: build it from packages on the index, pack it for a GPU machine.",
                  no_args_is_help=True, rich_markup_mode="rich")


@app.command("build")
def build_cmd(
    out: Path = typer.Option(..., help="corpus folder (manifest.jsonl, summary.json, files/)"),
    cache: Path = typer.Option(None, help="folder the archives are downloaded into (kept: a second build needs no "
                                          "index) [default: pip-corpus under $SPARSERL_CACHE_DIR or "
                                          "~/.cache/sparserl]"),
    archives: Path = typer.Option(None, help="read this folder of downloaded archives (.whl, .tar.gz, .zip) instead "
                                             "of fetching: no index needed [default: fetch]"),
    packages: str = typer.Option("", help="comma-separated NAME or NAME==VERSION (optionally :wheel or :sdist) "
                                          "[default: the built-in list: see 'sparserl corpus sources']"),
    heldout: str = typer.Option(None, help="comma-separated packages held out whole, each one of the build's "
                                           "packages [default: those of torch-sparse,mamba-ssm,gsplat in the "
                                           "build]"),
    heldout_fraction: float = typer.Option(0.01, help="share of every other fetched package's files held out (the "
                                                      "toolkit, library and templates give none)"),
    near_duplicate: float = typer.Option(0.8, help="drop a held-out file with at least this share of its lines in "
                                                   "one training file (a near-copy)"),
    toolkit: bool = typer.Option(True, "--toolkit/--no-toolkit", help="add the CUDA toolkit's headers"),
    library: bool = typer.Option(True, "--library/--no-library", help="add the project's kernel library"),
    templates: bool = typer.Option(True, "--templates/--no-templates",
                                   help="add the search templates rendered at their seed points on small generated "
                                        "matrices (the specialised kernels the search's winners are made of)"),
    max_file_kb: int = typer.Option(256, help="drop files larger than this (KiB)"),
    index_url: str = typer.Option(None, help="package index for pip [default: pip's own setting]"),
) -> None:
    """Fetch packages that ship CUDA C++ (or read downloaded archives), filter, de-duplicate, split."""
    from sparserl.corpus.build import BuildConfig, build
    from sparserl.corpus.filters import FileRules
    from sparserl.corpus.sources import DEFAULT_PACKAGES, parse_requirement

    specs = tuple(parse_requirement(p) for p in packages.split(",") if p.strip()) or DEFAULT_PACKAGES
    held = tuple(filter(None, (h.strip() for h in heldout.split(",")))) if heldout is not None else None
    cfg = BuildConfig(out=str(out), cache=str(cache) if cache else None, archives=str(archives) if archives else None,
                      packages=specs, heldout_packages=held, heldout_fraction=heldout_fraction,
                      near_duplicate=near_duplicate, toolkit=toolkit,
                      library=library, templates=templates, rules=FileRules(max_bytes=max_file_kb << 10), index_url=index_url)
    summary = build(cfg)
    typer.echo(_table(summary))
    typer.echo(f"wrote {out}/manifest.jsonl, summary.json and files/ ({summary['files']} files) "
               f"in {summary['seconds']:.0f} s")


def _table(summary: dict) -> str:
    mb = 1e6
    lines = [f"{'package':24} {'version':12} {'kept':>6} {'unique MB':>9} {'heldout MB':>10} {'dup MB':>7} "
             f"{'near MB':>7} {'dropped MB':>10} {'excluded MB':>11}  licence"]
    for name, t in summary["packages"].items():
        dropped = sum(d["bytes"] for d in t["dropped"].values())
        lines.append(f"{name:24} {t['version'][:12]:12} {t['kept']:>6} {t['kept_bytes'] / mb:>9.2f} "
                     f"{t['heldout_bytes'] / mb:>10.2f} {t['duplicate_bytes'] / mb:>7.2f} "
                     f"{t['near_duplicate_bytes'] / mb:>7.2f} {dropped / mb:>10.2f} "
                     f"{t['excluded_bytes'] / mb:>11.2f}  {t['licence'][:40]}")
    lines.append(f"{'total':24} {'':12} {summary['files']:>6} {summary['unique_bytes'] / mb:>9.2f} "
                 f"{summary['heldout_bytes'] / mb:>10.2f} {summary['duplicate_bytes'] / mb:>7.2f} "
                 f"{summary['near_duplicate_bytes'] / mb:>7.2f}")
    return "\n".join(lines)


@app.command("sources")
def sources_cmd() -> None:
    """The built-in package list: name, version, archive kind, what is taken."""
    from sparserl.corpus.sources import DEFAULT_HELDOUT, DEFAULT_PACKAGES

    for s in DEFAULT_PACKAGES:
        held = "  [held out]" if s.name in DEFAULT_HELDOUT else ""
        typer.echo(f"{s.requirement:34} {s.archive:6} {s.note}{held}")


@app.command("pack")
def pack_cmd(
    corpus: Path = typer.Option(..., help="a built corpus folder (sparserl corpus build)"),
    out: Path = typer.Option(..., help="pack folder (tokenizer/, token files, pack.json)"),
    vocab_size: int = typer.Option(8192, help="BPE vocabulary of the tokenizer trained on the train split"),
    max_mib: float = typer.Option(40.0, help="most MiB the pack may take (the train split is cut to fit; 0: no "
                                             "limit)"),
    library_repeats: int = typer.Option(10, help="times the project's own kernels (the library's files and the "
                                                 "templates' renders) appear in the train stream"),
    tokenizer_mb: float = typer.Option(32.0, help="MB of train text the tokenizer is trained on (a seeded sample)"),
    seed: int = typer.Option(0, help="seed of the document order and the tokenizer sample"),
) -> None:
    """Tokenise a built corpus once (train split, held-out files per package) into a small folder a GPU
    machine can take: a digit-splitting BPE tokenizer, compressed uint16 token files, pack.json."""
    from sparserl.corpus.pack import PackConfig, pack

    info = pack(PackConfig(corpus=str(corpus), out=str(out), vocab_size=vocab_size, max_mib=max_mib,
                           library_repeats=library_repeats, tokenizer_mb=tokenizer_mb, seed=seed))
    typer.echo(json.dumps({k: info[k] for k in ("vocab_size", "train_tokens", "train_tokens_total", "heldout_tokens",
                                                "chars_per_token", "pack_mib", "seconds")}, indent=1))
    typer.echo(f"wrote {out} ({info['pack_mib']:.1f} MiB)")
