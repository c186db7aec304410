"""``sparserl data build``: SFT pairs (the defaults are :class:`~sparserl.data.sft_build.SFTDataConfig`'s)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from sparserl.cli.common import defaults, fallback, integers, names
from sparserl.data.sft_build import SFTDataConfig, build_sft_data, make_matrices
from sparserl.data.siblings import SiblingConfig
from sparserl.errors import SparseRLError
from sparserl.runs import check_output

D = defaults(SFTDataConfig)
SD = defaults(SiblingConfig)

app = typer.Typer(help="SFT data: (matrix, correct kernel) pairs from the reference library.",
                  no_args_is_help=True, rich_markup_mode="rich")


@app.command("build")
def data_build_cmd(
    out: Path = typer.Option(Path(D.out), help="output folder (matrices/, train/val/test.jsonl, summary.json)"),
    families: str = typer.Option("", help="comma-separated generator families [default: all]"),
    per_family: int = typer.Option(D.matrices_per_family, help="generated matrices per family"),
    min_rows: int = typer.Option(D.min_rows, help="fewest rows of a generated matrix"),
    max_rows: int = typer.Option(D.max_rows, help="most rows of a generated matrix"),
    size_draw: str = typer.Option(D.size_draw, help="random (each matrix's rows log-uniform over the range) or "
                                                    "stratified (a family's i-th matrix in the i-th of --per-family "
                                                    "equal parts of the range on a log scale)"),
    vary_params: bool = typer.Option(D.vary_params, "--vary-params/--default-params",
                                     help="draw each generated matrix's structural parameters (bands, row lengths, "
                                          "blocks per block row) instead of its family's defaults, so that "
                                          "specialised kernels' facts differ from matrix to matrix"),
    real_dir: Path = typer.Option(None, help="folder of real matrices (.mtx/.mtx.gz/.npz), test split "
                                             "[default: none]"),
    real_split: str = typer.Option(D.real_split, help="the real matrices' split: test (all of them) or mixed "
                                                      "(split by --val-fraction and --test-fraction like a "
                                                      "generated family's)"),
    ops: str = typer.Option(",".join(D.ops), help="spmv, spmm or spmv,spmm"),
    ks: str = typer.Option(None, help="SpMM column counts, comma-separated (with spmm in --ops only) "
                                      f"[default: {','.join(map(str, D.ks))}]"),
    target: str = typer.Option(D.target, help="correct (a random correct variant), fastest (the fastest ones) "
                                              "or near_fastest (random among those within --near-fastest-ratio "
                                              "of the fastest)"),
    targets_per_matrix: int = typer.Option(D.targets_per_matrix, help="rows per train (matrix, op, k)"),
    near_fastest_ratio: float = typer.Option(D.near_fastest_ratio, help="near_fastest: at most this times the "
                                                                        "fastest time"),
    variants_per_matrix: int = typer.Option(None, help="evaluate this many random library variants per matrix "
                                                       "[default: all]"),
    max_target_chars: int = typer.Option(None, help="only library variants of at most this many characters "
                                         "without comments are evaluated and taught [default: no limit]"),
    val_fraction: float = typer.Option(D.val_fraction, help="share of each family's matrices for validation "
                                                            "(rounded down)"),
    test_fraction: float = typer.Option(D.test_fraction, help="share of each family's matrices for test "
                                                              "(rounded down)"),
    compile_only: bool = typer.Option(False, "--compile-only", help="targets are variants that compile (no "
                                                                    "times); the default without a GPU"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier data set in OUT"),
    matrices_only: bool = typer.Option(False, "--matrices-only", help="only generate the matrices into "
                                       "OUT/matrices (CPU, no GPU needed) and stop: a later build with the same "
                                       "matrix options finds them there"),
    distinct_from: list[Path] = typer.Option(None, "--distinct-from", help="a data folder (or folder of "
                                             "matrices) whose structures no matrix here may repeat; repeatable "
                                             "[default: none]"),
    seed: int = typer.Option(D.seed, help="random seed"),
) -> None:
    """Render library variants for each matrix, check them with the harness, write JSONL splits."""
    op_list = names(ops)
    if ks is not None and "spmm" not in op_list:
        raise SparseRLError("--ks are SpMM column counts: give --ops spmm (or spmv,spmm), or leave --ks out")
    k_list = integers(ks, "--ks") if ks is not None else D.ks
    if not matrices_only:  # the matrices alone write no data set over an earlier one, and need no GPU
        check_output(out, "data", force)
        compile_only = fallback(compile_only)
    cfg = SFTDataConfig(out=str(out), families=names(families), matrices_per_family=per_family, min_rows=min_rows,
                        max_rows=max_rows, size_draw=size_draw, vary_params=vary_params,
                        real_dir=str(real_dir) if real_dir else None, real_split=real_split,
                        ops=op_list, ks=k_list,
                        target=target, targets_per_matrix=targets_per_matrix, variants_per_matrix=variants_per_matrix,
                        max_target_chars=max_target_chars,
                        near_fastest_ratio=near_fastest_ratio, val_fraction=val_fraction,
                        test_fraction=test_fraction, compile_only=compile_only,
                        distinct_from=tuple(map(str, distinct_from or ())), seed=seed)
    if matrices_only:
        entries = make_matrices(cfg)
        typer.echo(f"{sum(e.family != 'real' for e in entries)} generated matrices in {out / 'matrices'}")
        return
    summary = build_sft_data(cfg)
    usable = "compiled" if compile_only else "correct"  # compile-only: nothing was verified
    typer.echo(json.dumps({k: summary[k] for k in ("matrices", "rows", "evaluations", usable, "seconds")}, indent=1))


@app.command("siblings")
def data_siblings_cmd(
    teacher: Path = typer.Argument(..., help="a teacher's rows (JSONL, e.g. `sparserl best export`'s)"),
    out: Path = typer.Option(..., help="output folder: siblings.jsonl, summary.json, matrices/"),
    per_row: int = typer.Option(SD.per_row, help="siblings wanted per specialised teacher row"),
    spread: float = typer.Option(SD.spread, help="a sibling's rows within this fraction of its teacher row's"),
    vary_params: bool = typer.Option(SD.vary_params, "--vary-params/--default-params",
                                     help="draw each sibling's structural parameters, not its family's defaults"),
    distinct_from: list[Path] = typer.Option(None, "--distinct-from", help="a data folder (or folder of matrices) "
                                             "whose structures no sibling may repeat, such as the held-out "
                                             "splits'; repeatable [default: none]"),
    family_rows: list[int] = typer.Option(None, "--family-rows", help="no sibling repeats the families set "
                                          "`evaluate --matrices families --family-rows N` makes; repeatable "
                                          "[default: none]"),
    seed: int = typer.Option(SD.seed, help="random seed"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier siblings set in OUT"),
) -> None:
    """A teacher's specialised kernels taught again on new matrices of their families (CPU).

    For each teacher row whose kernel is a specialised template's (its facts baked in: DIA offsets, a row length,
    block columns), up to --per-row new matrices of the same family and nearly the same size, each with the same
    template at the row's numbers rendered for its card; kept only where the facts block is one no row taught yet.
    The rows carry no times: they were not measured. Merge them into the SFT set so that the policy sees many facts
    blocks per template and must read them from the card (see src/sparserl/data/siblings.py)."""
    import shutil

    from sparserl.checks import require_folders
    from sparserl.data.rows import read_rows, write_rows
    from sparserl.data.siblings import SiblingConfig, sibling_rows
    from sparserl.eval.compare import family_set
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import matrix_card, structure_fingerprint
    from sparserl.matrices.fingerprints import matrices_folder
    from sparserl.matrices.io import matrices_in
    from sparserl.parallel import parallel_map

    cfg = SiblingConfig(per_row=per_row, spread=spread, vary_params=vary_params, seed=seed)
    check_output(out, "siblings", force)
    folders = tuple(map(str, distinct_from or ()))
    require_folders("--distinct-from", folders, "a data folder or a folder of matrices")
    files = []
    for d in folders:
        found = matrices_in(matrices_folder(d))
        if not found:
            raise SparseRLError(f"--distinct-from {d}: no matrices in it (nothing would be held out from it)")
        files += found
    if any(n < 1 for n in family_rows or ()):
        raise SparseRLError(f"--family-rows must be at least 1, got {min(family_rows)}")
    rows = read_rows(teacher)
    def described(A) -> tuple[str, object]:
        return structure_fingerprint(A), matrix_card(A)

    held_out = parallel_map(lambda f: described(load_matrix(f)), files, name="held-out")
    for n in family_rows or ():
        held_out += [described(A) for _, A in family_set(n)]
    avoid, cards = {fp for fp, _ in held_out}, [card for _, card in held_out]
    shutil.rmtree(out / "matrices", ignore_errors=True)  # an earlier set's (--force): its files would be read as ours
    made, counts = sibling_rows(rows, cfg, out, avoid, held_out_cards=cards)
    write_rows(out / "siblings.jsonl", made)
    summary = counts.to_dict() | {"config": dataclasses.asdict(cfg), "teacher": str(teacher)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    by_template = ", ".join(f"{t} {n}" for t, n in sorted(counts.made.items())) or "none"
    typer.echo(f"{len(made)} sibling rows from {counts.specialised_rows} specialised teacher rows ({by_template}) "
               f"in {out / 'siblings.jsonl'}; distinct facts blocks per template now {counts.distinct_facts}")
