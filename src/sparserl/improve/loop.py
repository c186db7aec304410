"""The round loop of ``sparserl improve`` (expert iteration), resumable at the phase it stopped in.

Round 0 validates the starting model: the bar a round must beat (and the library oracle's
times on the validation matrices, measured once and reused). Then each round ``r``:

1. **search**: ``matrices_per_round`` training matrices (a fixed shuffled order, round after
   round), each searched with :func:`sparserl.search.run.search_array`, the current best
   policy proposing; every verified kernel goes to the best-known store as it arrives;
2. **collect**: the store's verified kernels within ``within`` of their matrix's best known, on
   every training matrix this run searched so far (:func:`sparserl.search.export.export_rows`),
   leaving out those that bake in facts the policy's prompt card does not show (a long-row table
   the card's listed rows and bins do not prove complete, diagonal offsets too many to list:
   ``seen_only``),
   plus ``replay`` times as many rows of the data's own train split, written as SFT data to
   ``round_r/teacher/train.jsonl``;
3. **finetune**: :func:`sparserl.train.sft.sft` from the current best policy on that data
   (``round_r/sft``);
4. **validate**: :func:`sparserl.eval.compare.evaluate` of the fine-tuned policy on the
   validation matrices (the same ones every round): best-of-``val_samples`` speedup geomean
   against cuSPARSE and against the library oracle, and the share of correct samples;
5. **decide**: the round is kept when its figure against the oracle (against cuSPARSE when no
   oracle was timed) beats the best so far by more than ``min_gain``, or equals it with more
   correct samples (a tie happens when neither has a correct kernel), and it does not lower the
   share of correct samples below ``min_correct`` (90% by default; a round under it must at least
   keep the best's share): its checkpoint becomes ``best/``. Otherwise the next round starts again
   from the previous best.

After the last round, the starting policy and the best one are evaluated side by side on the
data's test split (never searched, never validated on) with cuSPARSE and the library oracle
(``test_samples`` each, one policy at a time; ``OUT/test/``, a table in ``rounds.md``): the validation figures chose the
kept rounds, so only these are free of that choice.

``state.json`` is written after every phase (and after each matrix of the search), so a kill
resumes at the phase it was in; the search's verified results are in the store already, and a
matrix searched before the kill is not searched again. Each finished round goes to
``rounds.json``, ``rounds.md`` (:mod:`.table`), ``rounds.png`` (:mod:`.plot`, with matplotlib),
``metrics.jsonl`` and TensorBoard (one step per round, through the trainers'
:class:`~sparserl.runtime.metrics.MetricLogger`).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import gc

import numpy as np
import torch

from sparserl.data.rows import SFTRow, read_rows, write_rows
from sparserl.devices import pick_device, visible_gpus
from sparserl.errors import SparseRLError
from sparserl.eval.compare import EvalConfig, evaluate
from sparserl.eval.metrics import kept_speedup, speedup_at_1
from sparserl.eval.library_match import shares
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.improve.config import ImproveConfig
from sparserl.improve.plot import plot_rounds
from sparserl.improve.table import geomean_of, round_metrics, rounds_markdown
from sparserl.model.policy import Policy
from sparserl.parallel import parallel_map
from sparserl.request.context import MatrixContext
from sparserl.request.warm import warm_context
from sparserl.runtime.metrics import MetricLogger
from sparserl.search.export import ExportFilter, export_rows
from sparserl.search.footprint import check_fits
from sparserl.search.loop import SearchConfig
from sparserl.search.run import SearchJob, open_proposer, search_array
from sparserl.search.space import Provenance
from sparserl.search.store import harness_version, open_store
from sparserl.train.sft import SFTConfig, sft

log = logging.getLogger(__name__)

PHASES = ("search", "collect", "finetune", "validate", "decide")
STATE_VERSION = 1

NO_GPU = ("sparserl improve needs an NVIDIA GPU: without one a search verifies nothing (compile-only results "
          "never enter the best-known store), so there is nothing to learn from; run it on a GPU machine")


# -- matrices ---------------------------------------------------------------------------------


def split_rows(data: str, split: str) -> list[SFTRow]:
    """One data row per matrix file of ``split`` (the first row of each), in file order."""
    path = Path(data) / f"{split}.jsonl"
    if not path.exists():
        raise SparseRLError(f"{data}: no {split}.jsonl (give the data folder 'sparserl data build' wrote, --data)")
    seen: dict[str, SFTRow] = {}
    for row in read_rows(path):
        if row.matrix and row.matrix not in seen and Path(row.matrix).exists():
            seen[row.matrix] = row
    if not seen:
        raise SparseRLError(f"{path}: no row names a matrix file that exists here")
    return list(seen.values())


def round_matrices(train: list[SFTRow], r: int, n: int, seed: int) -> list[SFTRow]:
    """The training rows searched in round ``r`` (1-based): the next ``n`` of a shuffled order, cycling."""
    order = np.random.default_rng(seed).permutation(len(train))
    n = min(n, len(train))
    return [train[order[((r - 1) * n + j) % len(train)]] for j in range(n)]


# -- validation -------------------------------------------------------------------------------


def validation_figures(per_matrix: dict[str, dict], oracle: dict[str, float | None] | None) -> dict:
    """The figures a round is judged by, from ``evaluate``'s per-matrix records of one policy.

    Every speed counts as :func:`~sparserl.eval.metrics.kept_speedup` (a matrix without a correct
    sample, or whose best correct sample is slower, counts as 1.0: the user keeps cuSPARSE; the
    oracle likewise), so a round cannot gain by turning slow correct kernels into wrong ones.
    ``geomean_speedup``: best-of-k against cuSPARSE; ``vs_oracle``: the same against the library
    oracle's best (None without oracle times); ``ahead_of_oracle``: share of matrices where the
    policy's best is faster than the oracle's; ``speedup_at_1``: the expected single sample;
    ``correct_rate``: correct samples over all samples."""
    recs = list(per_matrix.values())
    n = sum(r["n"] for r in recs)
    best = {m: kept_speedup(r["best_speedup"]) for m, r in per_matrix.items()}
    out: dict[str, Any] = {
        "matrices": len(recs), "samples": n,
        "correct_rate": sum(r["correct"] for r in recs) / n if n else 0.0,
        "compile_rate": sum(r["compiled"] for r in recs) / n if n else 0.0,
        "geomean_speedup": geomean_of(list(best.values())),
    }
    if recs and all(r.get("sample_speedups") for r in recs):
        out["speedup_at_1"] = speedup_at_1([r["sample_speedups"] for r in recs])
    if oracle:
        ratios = [best[m] / kept_speedup(oracle.get(m)) for m in best]
        out["vs_oracle"] = geomean_of(ratios)
        out["ahead_of_oracle"] = sum(x > 1.0 for x in ratios) / len(ratios) if ratios else 0.0
    out["score"] = out.get("vs_oracle") if out.get("vs_oracle") is not None else out["geomean_speedup"]
    return out


def oracle_speedups(res: dict) -> dict[str, float | None]:
    """Each matrix's library-oracle speedup from ``evaluate``'s result (empty without the baseline)."""
    return {m: rec["best_speedup"] for m, rec in res["per_matrix"].get("library oracle", {}).items()}


def _rounded(fig: dict) -> dict:
    """Figures for a log line: floats to 3 decimals."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in fig.items()}


def improved(fig: dict, best: dict | None, min_gain: float, min_correct: float = 0.0) -> tuple[bool, str]:
    """Whether validation figures ``fig`` beat ``best`` (None: nothing to beat) without lowering the
    share of correct samples below ``min_correct``: a round must reach ``min_correct``, or the best's
    share where that is lower (a start under the floor can still be improved on); and why, in words.
    The first validation (the starting model) is the baseline whatever its correct share."""
    if best is None:
        return True, "first validation"
    floor = min(min_correct, best.get("correct_rate", 0.0))
    if fig.get("correct_rate", 0.0) < floor:
        return False, (f"correct share {fig.get('correct_rate', 0.0):.2f} < {floor:.2f} (a round may not lower it "
                       f"below {min_correct:.0%})")
    s, b = fig.get("score"), best.get("score")
    if s is None:
        return False, "no validation figure"
    if b is None or s > b * (1 + min_gain):
        return True, (f"score {s:.3f} > {b if b is None else round(b, 3)}"
                      + (f" by > {min_gain:.0%}" if min_gain else ""))
    if math.isclose(s, b, rel_tol=1e-9) and fig.get("correct_rate", 0) > best.get("correct_rate", 0):
        return True, f"score {s:.3f} = best, more correct ({fig['correct_rate']:.2f} > {best['correct_rate']:.2f})"
    return False, f"score {s:.3f} <= best {b:.3f}" + (f" x (1 + {min_gain})" if min_gain else "")


# -- the run ----------------------------------------------------------------------------------


class Improve:
    """One ``sparserl improve`` run (see the module docstring). ``validate(policy, round) -> figures``
    replaces the evaluation (tests); ``on_phase(round, phase)`` is called after each phase is saved."""

    def __init__(self, cfg: ImproveConfig, evaluator, validate: Callable | None = None,
                 on_phase: Callable[[int, str], None] | None = None):
        self.cfg, self.out = cfg, Path(cfg.out)
        self.ev, self.validate_fn, self.on_phase = evaluator, validate, on_phase
        self.state_path = self.out / "state.json"
        self.train = split_rows(cfg.data, "train")
        self.state = self._load_or_start()

    # -- state --

    def _load_or_start(self) -> dict:
        cfg = self.cfg
        if cfg.resume and self.state_path.exists():
            st = json.loads(self.state_path.read_text())
            if st.get("version") != STATE_VERSION:
                raise SparseRLError(f"{self.state_path}: written by another version of sparserl improve")
            changed = [f.name for f in fields(cfg) if f.name not in ("rounds", "resume")
                       and st["config"].get(f.name) != json.loads(json.dumps(getattr(cfg, f.name)))]
            if changed:
                log.warning("resuming with settings changed since the run started: %s", ", ".join(changed))
            log.info("resuming %s at round %d, phase %s", self.out, st["round"], st["phase"])
            st["config"] = asdict(cfg)
            return st
        earlier = [*self.out.glob("round_*"),
                   *(self.out / n for n in ("best", "best.tmp", "best.old", "valset", "tb", "test", "testset"))]
        for p in earlier:  # an earlier run's folders (--force): its checkpoints must not be resumed or kept
            if p.is_dir():
                shutil.rmtree(p)
        for f in ("state.json", "rounds.json", "rounds.md", "rounds.png"):
            (self.out / f).unlink(missing_ok=True)
        val = split_rows(cfg.data, "val")
        pick = np.random.default_rng(cfg.seed).permutation(len(val))[: cfg.val_matrices]
        return {"version": STATE_VERSION, "config": asdict(cfg), "round": 0, "phase": "validate",
                "best": None, "best_model": cfg.model, "oracle": None,
                "val_rows": [val[i].to_dict() for i in sorted(pick)],
                "train_fingerprints": [], "current": {}, "rounds": [], "logged": -1}

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str))
        tmp.replace(self.state_path)

    def _done(self, r: int, phase: str, next_phase: str, seconds: float | None = None) -> None:
        if seconds is not None:  # a phase resumed after a kill adds the time spent since
            secs = self.state["current"].setdefault("seconds", {})
            secs[phase] = round(secs.get(phase, 0.0) + seconds, 2)
        self.state["phase"] = next_phase
        self.save()
        log.info("round %d: %s done%s", r, phase, f" in {seconds:.1f} s" if seconds is not None else "")
        if self.on_phase is not None:
            self.on_phase(r, phase)

    def round_dir(self, r: int) -> Path:
        return self.out / f"round_{r}"

    # -- the loop --

    def run(self) -> dict:
        st, cfg = self.state, self.cfg
        self.save()
        self._write_valset()
        resumed = cfg.resume and (self.out / "metrics.jsonl").exists()  # rows past the last logged round go
        self.logger = MetricLogger(self.out, resumed_at=st["logged"] if resumed else None)
        self.store = open_store(cfg.store)
        try:
            self._catch_up()
            while st["round"] <= cfg.rounds:
                r, phase = st["round"], st["phase"]
                t = time.perf_counter()
                if phase == "search":
                    self.search(r)
                    self._done(r, "search", "collect", time.perf_counter() - t)
                elif phase == "collect":
                    n = self.collect(r)
                    self._done(r, "collect", "finetune" if n else "decide", time.perf_counter() - t)
                elif phase == "finetune":
                    self.finetune(r)
                    self._done(r, "finetune", "validate", time.perf_counter() - t)
                elif phase == "validate":
                    self.validate(r)
                    self._done(r, "validate", "decide", time.perf_counter() - t)
                elif phase == "decide":
                    self.decide(r)
                else:
                    raise SparseRLError(f"{self.state_path}: unknown phase {phase!r}")
            self.held_out()
        finally:
            self.logger.close()
            self.store.close()
        return {"rounds": st["rounds"], "best": st["best"], "best_model": st["best_model"],
                "test": st.get("test"), "table": str(self.out / "rounds.md")}

    def _write_valset(self) -> None:
        """The validation matrices as a data folder's val split (what ``evaluate`` reads)."""
        self._write_split("valset", "val", [SFTRow.from_dict(r) for r in self.state["val_rows"]])

    def _write_split(self, folder: str, split: str, rows: list[SFTRow]) -> Path:
        """``rows`` as split ``split`` of the data folder ``OUT/folder`` (what ``evaluate`` reads)."""
        d = self.out / folder
        write_rows(d / f"{split}.jsonl", rows)
        return d

    # -- 1. search --

    def search(self, r: int) -> None:
        """Search this round's training matrices with the current best policy proposing; each one's
        figures go to the state as it finishes (a killed round does not search it again)."""
        cfg = self.cfg
        done: dict = self.state["current"].setdefault("search", {})
        todo = [row for row in round_matrices(self.train, r, cfg.matrices_per_round, cfg.seed)
                if row.matrix_name not in done]
        if not todo:
            return
        model = self.state["best_model"]
        policy = self._policy(model)
        trace_dir = self.round_dir(r) / "search"
        trace_dir.mkdir(parents=True, exist_ok=True)

        def load(row: SFTRow) -> MatrixContext | SparseRLError:  # a matrix that fails skips itself only
            try:  # loaded, and its proposals' prompt made, in threads before the first search starts
                return warm_context(MatrixContext.load(row.matrix, self.cfg.op, self.cfg.k), [policy.config])
            except SparseRLError as exc:
                return exc

        try:
            contexts = parallel_map(load, todo, name="load")
            for row, ctx in zip(todo, contexts):
                t = time.perf_counter()
                try:
                    if isinstance(ctx, SparseRLError):
                        raise ctx
                    res = self._search_one(r, ctx, policy, model, trace_dir, len(done))
                except SparseRLError as exc:  # this matrix only (what it verified is in the store already)
                    log.warning("round %d: %s skipped: %s", r, row.matrix_name, exc)
                    done[row.matrix_name] = {"skipped": str(exc)}
                    self.save()
                    continue
                done[row.matrix_name] = self._search_figures(res) | {"seconds": round(time.perf_counter() - t, 2)}
                if res.fingerprint not in self.state["train_fingerprints"]:
                    self.state["train_fingerprints"].append(res.fingerprint)
                self.save()  # a kill from here on does not search this matrix again
        finally:
            policy = None  # noqa: F841 (the last reference: the model's memory goes back)
            self._release()

    def _search_one(self, r: int, ctx: MatrixContext, policy: Policy, model: str, trace_dir: Path, n_done: int):
        """One training matrix searched (raises SparseRLError when it does not fit, or the search stops)."""
        cfg = self.cfg
        check_fits(ctx.name, *ctx.shape, ctx.nnz, ctx.k)
        scfg = SearchConfig(budget=cfg.search_budget, seconds=cfg.search_seconds, regime=cfg.regime,
                            policy_share=cfg.policy_share, seed=cfg.seed + 1000 * r + n_done,
                            cost_model=cfg.search_cost_model)
        job = SearchJob(matrix=ctx.path, op=cfg.op, k=ctx.k, search=scfg, model=str(model), fill_facts=False,
                        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, device=cfg.device)
        log.info("round %d: searching %s (%d of %d), %d candidates", r, ctx.name, n_done + 1,
                 min(cfg.matrices_per_round, len(self.train)), cfg.search_budget)
        return search_array(ctx, scfg, self.ev, self.store,
                            run_config={"improve": str(self.out), "round": r, "job": asdict(job)},
                            proposer=open_proposer(job, ctx, self.ev, policy), model=str(model),
                            trace=trace_dir / f"{ctx.name}.jsonl")

    def _search_figures(self, res) -> dict:
        """What the round table keeps of one matrix's search."""
        cfg = self.cfg
        policy_kinds = (Provenance.POLICY_SAMPLE, Provenance.POLICY_REFINE)
        pol = [e for e in res.entries if e.proposal.provenance in policy_kinds]
        known = self.store.best(fingerprint=res.fingerprint, op=cfg.op, k=cfg.k, regime=cfg.regime,
                                harness_version=harness_version())
        return {
            "fingerprint": res.fingerprint, "evaluated": res.evaluated, "correct": sum(e.result.ok for e in res.entries),
            "policy": len(pol), "policy_correct": sum(e.result.ok for e in pol),
            "policy_failed": {kind: sum(e.result.error_kind.value == kind for e in pol)
                              for kind in {e.result.error_kind.value for e in pol if not e.result.ok}},
            "best_speedup": res.best.result.speedup if res.best else None,
            "best_provenance": res.best.proposal.provenance.value if res.best else None,
            "store_improved": res.store_improved,
            "policy_set_best": any(e.store_best and e.proposal.provenance in policy_kinds for e in res.entries),
            "best_known_speedup": max((b.speedup for b in known), default=None),
            "no_gpu": all(e.result.error_kind is ErrorKind.NO_GPU for e in res.entries)}

    # -- 2. collect --

    def collect(self, r: int) -> int:
        """Write the teacher set; returns its rows."""
        cfg = self.cfg
        flt = ExportFilter(op=cfg.op, regime=cfg.regime, harness_version=harness_version(), per_matrix=cfg.per_matrix,
                           within=cfg.within, fingerprints=frozenset(self.state["train_fingerprints"]), seen_only=True,
                           max_chars=cfg.max_target_chars)
        rows, skipped = export_rows(self.store, flt)
        rows = [row for row in rows if row.k == cfg.k]
        replay = self._replay(r, round(cfg.replay * len(rows)))
        d = self.round_dir(r) / "teacher"
        write_rows(d / "train.jsonl", rows + replay)
        write_rows(d / "val.jsonl", [])  # the round's validation is its own phase
        prov: dict[str, int] = {}
        for row in rows:
            prov[row.origin.provenance] = prov.get(row.origin.provenance, 0) + 1
        self.state["current"]["teacher"] = {
            "rows": len(rows), "matrices": len({row.origin.fingerprint for row in rows}), "provenance": prov,
            "policy_rows": sum(v for p, v in prov.items() if p.startswith("policy")), "replay_rows": len(replay),
            "unseen_facts_dropped": skipped["unseen_facts"],
            "speedup_geomean": geomean_of([row.times.speedup for row in rows])}
        if not rows:
            log.warning("round %d: no verified kernel to learn from (nothing within %.0f%% of a best known): "
                        "the round fine-tunes nothing and keeps the previous best", r, 100 * cfg.within)
        return len(rows)

    def _replay(self, r: int, n: int) -> list[SFTRow]:
        """``n`` rows of the data's train split for op (and k), drawn afresh each round; none of a
        matrix this round's search skipped (a file that no longer loads would fail the fine-tune)."""
        if n < 1:
            return []
        cfg = self.cfg
        skipped = {name for name, fig in self.state["current"].get("search", {}).items() if "skipped" in fig}
        rows = [row for row in read_rows(Path(cfg.data) / "train.jsonl") if row.op == cfg.op
                and row.k == cfg.k and row.matrix_name not in skipped]
        if not rows:
            return []
        pick = np.random.default_rng([cfg.seed, r]).choice(len(rows), size=n, replace=n > len(rows))
        return [rows[i] for i in pick]

    # -- 3. finetune --

    def finetune(self, r: int) -> None:
        cfg = self.cfg
        steps = cfg.sft_steps
        scfg = SFTConfig(data=str(self.round_dir(r) / "teacher"), model=str(self.state["best_model"]),
                         out=str(self.round_dir(r) / "sft"), steps=steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr,
                         warmup_steps=min(cfg.sft_warmup, steps - 1), eval_every=steps, eval_samples=1,
                         eval_temperature=cfg.temperature,
                         max_new_tokens=cfg.max_new_tokens, save_every=max(1, steps // 4), resume=True,
                         device=cfg.device, bf16=cfg.bf16, seed=cfg.seed + r)
        res = sft(scfg, evaluator=self.ev)  # resume=True: a killed fine-tune of this round continues
        self.state["current"]["sft"] = {"steps": res["steps"], "loss": res.get("losses/sft"),
                                        "checkpoint": res["checkpoint"], "rows": res["train_rows"]}

    # -- 4. validate --

    def validate(self, r: int) -> None:
        model = self.state["current"]["sft"]["checkpoint"] if r else self.state["best_model"]
        policy = self._policy(model)
        try:
            fig = (self.validate_fn or self._evaluate)(policy, r)
        finally:
            policy = None  # noqa: F841 (the last reference: the model's memory goes back)
            self._release()
        self.state["current"]["val"] = fig
        log.info("round %d: validation %s", r, _rounded(fig))

    def _evaluate(self, policy, r: int) -> dict:
        cfg, st = self.cfg, self.state
        ecfg = EvalConfig(matrices=str(self.out / "valset"), split="val",
                          baselines=("oracle",) if st["oracle"] is None else (), op=cfg.op, k=cfg.k,
                          samples=cfg.val_samples, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                          out=str(self.round_dir(r) / "eval"), plots=False, seed=cfg.seed)
        name = f"round_{r}"
        res = evaluate(ecfg, evaluator=self.ev, policies={name: policy})
        if st["oracle"] is None and "library oracle" in res["per_matrix"]:  # timed once, at round 0
            st["oracle"] = oracle_speedups(res)
            st["oracle_geomean"] = geomean_of([v or 1.0 for v in st["oracle"].values()])
        # and the samples against the library: a library kernel exactly, a mismatched header, a new body
        return validation_figures(res["per_matrix"][name], st["oracle"]) | shares(res.get("library_match", {}).get(name))

    # -- 5. decide --

    def decide(self, r: int) -> None:
        st, cur = self.state, self.state["current"]
        fig = cur.get("val")
        if fig is None:
            keep, why = False, "no teacher data: nothing fine-tuned"
        else:
            keep, why = improved(fig, st["best"]["figures"] if st["best"] else None, self.cfg.min_gain,
                                 self.cfg.min_correct)
        model_in = st["best_model"]
        if keep and r > 0:
            self._install_best(Path(cur["sft"]["checkpoint"]))
            st["best_model"] = str(self.out / "best")
        if keep:
            st["best"] = {"round": r, "figures": fig, "score": fig.get("score")}
        rec = {"round": r, "model_in": model_in, "kept": keep, "why": why,
               "search": cur.get("search", {}), "teacher": cur.get("teacher"), "sft": cur.get("sft"), "val": fig,
               "seconds": cur.get("seconds", {}), "best_round": st["best"]["round"] if st["best"] else None,
               "best_score": st["best"]["score"] if st["best"] else None}
        st["rounds"] = [x for x in st["rounds"] if x["round"] != r] + [rec]
        st["round"], st["phase"], st["current"] = r + 1, "search", {}
        self.save()
        log.info("round %d: %s (%s)", r, "kept: best/ is this round's checkpoint" if keep and r
                 else "baseline" if r == 0 else "rejected: the next round starts from the previous best", why)
        sft_state = self.round_dir(r) / "sft" / "state.pt"  # the optimizer: not needed once the round is decided
        sft_state.unlink(missing_ok=True)
        self._catch_up()
        if self.on_phase is not None:
            self.on_phase(r, "decide")

    # -- 6. held out --

    def held_out(self) -> None:
        """The starting policy and the best one on the data's test split (``OUT/test/NAME/``), beside
        the library oracle, which the first evaluation times (every speedup is against cuSPARSE timed
        with it). Once per (best round, models, samples): a resumed run that kept no new round does not
        evaluate again. The policies are loaded one at a time. A failure here (a test matrix that no
        longer loads, say) is logged and leaves the rounds as they are: the next resume tries again."""
        cfg, st = self.cfg, self.state
        if not cfg.test_samples:
            return
        best_round = st["best"]["round"] if st["best"] else 0
        start = next((x["model_in"] for x in st["rounds"] if x["round"] == 0), cfg.model)
        models = {"start": start} | ({f"round_{best_round}": st["best_model"]} if best_round else {})
        key = {"best_round": best_round, "models": models, "samples": cfg.test_samples}
        if st.get("test") and all(st["test"].get(k) == v for k, v in key.items()):
            return
        try:
            rows = split_rows(cfg.data, "test")
        except SparseRLError as exc:
            log.info("no held-out evaluation: %s", exc)
            return
        d = self._write_split("testset", "test", rows)
        t = time.perf_counter()
        per_matrix: dict[str, dict] = {}
        oracle: dict[str, float | None] = {}
        try:
            for i, (name, path) in enumerate(models.items()):
                policy = self._policy(path)
                try:
                    ecfg = EvalConfig(matrices=str(d), split="test", baselines=("oracle",) if i == 0 else (),
                                      op=cfg.op, k=cfg.k, samples=cfg.test_samples, temperature=cfg.temperature,
                                      max_new_tokens=cfg.max_new_tokens, out=str(self.out / "test" / name),
                                      plots=False, seed=cfg.seed)
                    res = evaluate(ecfg, evaluator=self.ev, policies={name: policy})
                finally:
                    policy = None  # noqa: F841 (the last reference: the model's memory goes back)
                    self._release()
                if i == 0:
                    oracle = oracle_speedups(res)
                per_matrix[name] = res["per_matrix"][name]
        except (SparseRLError, OSError, ValueError) as exc:
            log.warning("held-out evaluation failed (the rounds stand; --resume tries it again): %s", exc)
            return
        st["test"] = key | {"matrices": len(rows), "oracle_geomean": geomean_of([v or 1.0 for v in oracle.values()]),
                            "seconds": round(time.perf_counter() - t, 2),
                            "figures": {n: validation_figures(per_matrix[n], oracle or None) for n in models}}
        log.info("held out (test split): %s", {n: _rounded(f) for n, f in st["test"]["figures"].items()})
        self._catch_up()

    def _install_best(self, ckpt: Path) -> None:
        """Copy ``ckpt`` to best/ (a copy first, then renames: a kill leaves best/ or its new copy whole)."""
        best, tmp, old = self.out / "best", self.out / "best.tmp", self.out / "best.old"
        if tmp.exists():
            shutil.rmtree(tmp)
        shutil.copytree(ckpt, tmp)
        if old.exists():
            shutil.rmtree(old)
        if best.exists():
            best.rename(old)
        tmp.rename(best)
        if old.exists():
            shutil.rmtree(old)

    def _catch_up(self) -> None:
        """Log the finished rounds not logged yet (metrics.jsonl, TensorBoard) and rewrite the tables."""
        st = self.state
        for rec in sorted(st["rounds"], key=lambda x: x["round"]):
            if rec["round"] > st["logged"]:
                self.logger.log(rec["round"], round_metrics(rec))
                st["logged"] = rec["round"]
        (self.out / "rounds.json").write_text(json.dumps({"config": st["config"], "oracle": st["oracle"],
                                                          "best": st["best"], "best_model": st["best_model"],
                                                          "rounds": st["rounds"], "test": st.get("test")},
                                                         indent=1, default=str))
        (self.out / "rounds.md").write_text(rounds_markdown(st))
        plot_rounds({self.out.name: st}, self.out / "rounds.png")  # none without matplotlib
        self.save()

    # -- models --

    def _policy(self, path: str):
        policy = Policy.open(path, device=str(pick_device(self.cfg.device)))
        policy.eval()
        return policy

    @staticmethod
    def _release() -> None:
        """Give the GPU memory of a model no longer referenced back (the harness's workers share the GPU)."""
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def improve(cfg: ImproveConfig, evaluator=None, *, validate: Callable | None = None,
            on_phase: Callable[[int, str], None] | None = None) -> dict:
    """Run (or resume) ``cfg.rounds`` rounds of expert iteration; returns the rounds and the best.

    ``evaluator``: the harness (default: a new one on this machine's GPUs; without a GPU the run
    is refused, since a search verifies nothing there). Tests inject a stand-in for its timing."""
    if evaluator is None and not visible_gpus():
        raise SparseRLError(NO_GPU)
    own = evaluator is None
    if own:
        evaluator = Evaluator(HarnessConfig(regimes=(cfg.regime,), reward_regime=cfg.regime))
    try:
        if not evaluator.has_gpu:
            raise SparseRLError(NO_GPU)
        return Improve(cfg, evaluator, validate, on_phase).run()
    finally:
        if own:
            evaluator.close()


__all__ = ["Improve", "ImproveConfig", "improve", "improved", "round_matrices", "validation_figures"]
