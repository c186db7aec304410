"""``sparserl improve`` from the command line (the defaults are :class:`ImproveConfig`'s)."""

from __future__ import annotations

from pathlib import Path

import typer

from sparserl.cli.common import defaults
from sparserl.improve.config import ImproveConfig
from sparserl.runs import check_output

D = defaults(ImproveConfig)


def improve_cmd(
    rounds: int = typer.Option(D.rounds, help="rounds of search, collect, fine-tune, validate (round 0, the "
                                              "starting model's validation, comes first)"),
    data: Path = typer.Option(Path(D.data), help="SFT data folder (sparserl data build): its train matrices are "
                                                 "searched, its val matrices validate"),
    model: Path = typer.Option(Path(D.model), help="the starting policy: a policy checkpoint or HF model folder"),
    out: Path = typer.Option(Path(D.out), help="output folder: rounds.md, rounds.json, metrics.jsonl, tb/, "
                                               "state.json, round_N/ (search traces, teacher data, SFT, eval), best/"),
    store: str = typer.Option(None, help="best-known store, the teacher: a file or postgresql:// URL [default: "
                                         "best_known.sqlite under the harness cache root, the one 'sparserl search' "
                                         "writes]"),
    op: str = typer.Option(D.op, help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
    matrices_per_round: int = typer.Option(D.matrices_per_round, help="training matrices searched per round (the "
                                                                      "next ones of a fixed shuffled order)"),
    search_budget: int = typer.Option(D.search_budget, help="candidates evaluated per matrix and round"),
    search_seconds: float = typer.Option(D.search_seconds, help="stop submitting a matrix's candidates after this "
                                                                "many seconds"),
    policy_share: float = typer.Option(D.policy_share, help="share of each search's budget for the policy's "
                                                            "samples and refinements"),
    search_cost_model: str = typer.Option(D.search_cost_model, help="the order each search tries candidates in: "
                                          "'default' (your model, else the packaged one), 'none' (the selector's "
                                          "and templates' order) or a model file"),
    temperature: float = typer.Option(D.temperature, help="the policy's sampling temperature (search and "
                                                          "validation)"),
    max_new_tokens: int = typer.Option(D.max_new_tokens, help="longest completion, in tokens [default: the longest library "
                                                       "kernel in the policy's tokens, plus a margin]"),
    regime: str = typer.Option(D.regime, help="L2 regime kernels are ranked in: cold or warm"),
    within: float = typer.Option(D.within, help="teacher: verified kernels at most this fraction slower than their "
                                                "matrix's best known (0.05: 5%)"),
    per_matrix: int = typer.Option(D.per_matrix, help="teacher: at most this many distinct kernels per matrix"),
    max_target_chars: int = typer.Option(D.max_target_chars, help="teacher: only kernels of at most this many "
                                         "characters without comments (the next fastest takes a longer one's "
                                         "place) [default: no limit]"),
    replay: float = typer.Option(D.replay, help="rows of the data's train split (the library-taught SFT pairs) "
                                                "mixed into each round's fine-tune, as a multiple of the teacher "
                                                "rows (0: none)"),
    sft_steps: int = typer.Option(D.sft_steps, help="fine-tune steps per round"),
    sft_batch_size: int = typer.Option(D.sft_batch_size, help="(matrix, kernel) pairs per fine-tune step"),
    sft_lr: float = typer.Option(D.sft_lr, help="peak fine-tune learning rate (warm-up, cosine decay)"),
    sft_warmup: int = typer.Option(D.sft_warmup, help="fine-tune warm-up steps"),
    val_matrices: int = typer.Option(D.val_matrices, help="validation matrices (the same every round)"),
    val_samples: int = typer.Option(D.val_samples, help="samples per validation matrix: the figure is their best"),
    min_gain: float = typer.Option(D.min_gain, help="keep a round only when it beats the best validation figure by "
                                                    "more than this fraction"),
    min_correct: float = typer.Option(D.min_correct, help="keep a round only when it does not lower the share of "
                                                          "correct validation samples below this (0: no floor)"),
    test_samples: int = typer.Option(D.test_samples, help="after the last round, samples per matrix of the starting "
                                                          "and the best policy on the data's test split, beside "
                                                          "cuSPARSE and the library oracle (0: skip)"),
    device: str = typer.Option(D.device, help="the model's device: auto, cpu or cuda[:N]"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in OUT at the phase it stopped in (give "
                                                        "a larger --rounds to add rounds)"),
    force: bool = typer.Option(False, "--force", help="start over in OUT (its earlier rounds are deleted)"),
    seed: int = typer.Option(D.seed, help="seed of the matrix order, searches, sampling and batches"),
) -> None:
    """Expert iteration (needs a GPU): each round searches training matrices with the current policy
    proposing, collects the verified kernels within --within of each matrix's best known, fine-tunes
    on them and validates; the round's checkpoint becomes OUT/best only when validation improves.
    Figures per round in OUT/rounds.md, rounds.json, metrics.jsonl and TensorBoard (OUT/tb)."""
    from sparserl.improve.loop import improve  # torch
    from sparserl.search.ranker import check_cost_model_option

    check_cost_model_option(search_cost_model, "--search-cost-model")
    check_output(out, "improve", force, resume)
    cfg = ImproveConfig(data=str(data), model=str(model), out=str(out), rounds=rounds,
                        store=str(store) if store else None, op=op, k=k, matrices_per_round=matrices_per_round,
                        search_budget=search_budget, search_seconds=search_seconds, policy_share=policy_share,
                        search_cost_model=search_cost_model,
                        temperature=temperature, max_new_tokens=max_new_tokens, regime=regime, within=within,
                        per_matrix=per_matrix, max_target_chars=max_target_chars, replay=replay,
                        sft_steps=sft_steps, sft_batch_size=sft_batch_size,
                        sft_lr=sft_lr, sft_warmup=sft_warmup, val_matrices=val_matrices, val_samples=val_samples,
                        min_gain=min_gain, min_correct=min_correct, test_samples=test_samples,
                        device=device, resume=resume, seed=seed)
    res = improve(cfg)
    typer.echo((out / "rounds.md").read_text())
    best = res["best"]
    typer.echo(f"best: round {best['round']} ({res['best_model']}); wrote {out}/rounds.md, rounds.json, metrics.jsonl"
               if best else f"wrote {out}/rounds.md, rounds.json, metrics.jsonl")
