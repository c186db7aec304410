"""Refinement turns in RL: the next turn's prompt shows the previous kernel and its outcome,
scores are discounted returns, turns merge into one batch, and a two-turn run trains end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sparserl.harness.compile import find_nvcc  # noqa: E402
from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402
from sparserl.rewards import RewardConfig  # noqa: E402
from sparserl.rl.rollout import MatrixItem, matrix_entry  # noqa: E402
from sparserl.rl.turns import (  # noqa: E402
    MAX_PREVIOUS_CHARS,
    collect_turns,
    concat_batches,
    discounted_returns,
    refinement_samples,
)
from sparserl.rl.update import Reference  # noqa: E402

from tests.rl.tiny import ScriptedEvaluator, tiny_policy  # noqa: E402

KERNEL = "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 128), block=128\nextern \"C\" __global__ void spmv_kernel() {}\n"


def test_discounted_returns() -> None:
    r = [torch.tensor([1.0, -1.0]), torch.tensor([2.0, 0.0]), torch.tensor([3.0, 4.0])]
    g = discounted_returns(r, 0.5)
    assert g[2].tolist() == [3.0, 4.0] and g[1].tolist() == [3.5, 2.0] and g[0].tolist() == [2.75, 0.0]
    assert r[0].tolist() == [1.0, -1.0], "inputs untouched"
    assert [x.tolist() for x in discounted_returns(r, 0.0)] == [x.tolist() for x in r]


def timed(t_us: float) -> EvalResult:
    kt = {"cold": KernelTiming("cold", t_us, t_us, t_us, 0.0)}
    return EvalResult(op="spmv", k=None, matrix="m", error_kind=ErrorKind.NONE, compiled=True, correct=True,
                      timings=kt, baseline={"cold": KernelTiming("cold", 40.0, 40.0, 40.0, 0.0)},
                      speedup=40.0 / t_us, format="CSR")


def wrong(msg: str) -> EvalResult:
    return EvalResult.failure("spmv", None, "m", ErrorKind.INCORRECT, msg, compiled=True)


@pytest.fixture()
def setup(tiny_tokenizer, tiny_hf_config):
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    A = generate("banded", 200, seed=0)
    inp, card = matrix_entry(A, policy)
    return policy, MatrixItem("m", A, "m", inp, Op.SPMV, None, card)


def test_the_next_prompt_shows_the_kernel_and_its_outcome(setup) -> None:
    from sparserl.rl.rollout import RolloutBatch

    policy, item = setup
    s = item.sample()
    batch = RolloutBatch([s, s], ["chatter\n```cuda\n" + KERNEL + "```\n", "x" * (3 * MAX_PREVIOUS_CHARS)],
                         torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1), torch.zeros(2, 1), torch.zeros(2, 1),
                         None, torch.zeros(2), [timed(20.0), wrong("y[7] differs")])
    nxt = refinement_samples([item, item], batch)
    assert nxt[0].matrix is s.matrix and nxt[0].card == s.card
    p0, p1 = nxt[0].prompt, nxt[1].prompt
    assert p0.startswith(f"SpMV y = A x for the 200 x 200 sparse matrix above ({item.A.nnz} nonzeros).\n")
    assert "Previous kernel:\n" + KERNEL.strip() in p0 and "chatter" not in p0  # the extracted kernel
    assert "Measured: correct; 20.00 us against cuSPARSE's 40.00 us (2.00x)" in p0 and "faster correct kernel" in p0
    assert "Measured: incorrect: y[7] differs." in p1 and "Write a correct kernel:" in p1
    assert p1.count("x") <= MAX_PREVIOUS_CHARS + 50, "a runaway completion is cut"
    if s.card:
        assert "Matrix card:\n" + s.card.strip() in p0


def test_two_turns_merge_with_discounted_scores(setup) -> None:
    policy, item = setup
    # turn 1: 20 us, wrong; turn 2 (refining each): 10 us, 40 us
    ev = ScriptedEvaluator([timed(20.0), wrong("bad"), timed(10.0), timed(40.0)])
    cfg = RewardConfig(name="clipped_log", r_eff=1.0, r_pen=0.5, clip=3.0)
    batch = collect_turns(policy, Reference(policy), None, ev, [item], 2, 8, 1.0, cfg, seed=0, turns=2, discount=0.5)
    assert len(batch.texts) == 4 and batch.response.shape[0] == 4 and batch.mask.shape == batch.old_logp.shape
    r1, r2 = [1.0, -3.5], [2.0, 0.0]  # log2(40/20), the wrong rung; log2(40/10), log2(40/40)
    assert batch.scores.tolist() == pytest.approx([r1[0] + 0.5 * r2[0], r1[1] + 0.5 * r2[1]] + r2)
    assert batch.samples[2].prompt is not None and batch.samples[0].prompt is None
    assert "Measured: incorrect: bad." in batch.samples[3].prompt
    assert batch.timings["turns/correct_rate_1"] == 0.5 and batch.timings["turns/correct_rate_2"] == 1.0
    assert batch.timings["turns/reward_mean_2"] == pytest.approx(1.0)


def test_concat_pads_to_the_longest(setup) -> None:
    from sparserl.rl.rollout import RolloutBatch

    policy, item = setup
    s = item.sample()

    def b(T: int, t_gen: float, share: float) -> RolloutBatch:
        return RolloutBatch([s], ["t"], torch.ones(1, T, dtype=torch.long), torch.ones(1, T), torch.ones(1, T),
                            torch.ones(1, T), None, torch.ones(1), [timed(10.0)],
                            {"time/generate": t_gen, "charts/harness_memo_share": share})

    m = concat_batches([b(2, 1.0, 0.0), b(5, 2.0, 1.0)], pad_id=7)
    assert m.response.tolist() == [[1, 1, 7, 7, 7], [1, 1, 1, 1, 1]]
    assert m.mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]] and m.values is None
    assert m.timings == {"time/generate": 3.0, "charts/harness_memo_share": 0.5}


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_a_two_turn_run_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    from sparserl.rl.trainer import RLConfig, train_rl

    mats = tmp_path / "mats"
    mats.mkdir()
    for i, fam in enumerate(("banded", "random")):
        save_matrix(generate(fam, 300, seed=i), mats / f"{fam}.npz")
    cfg = RLConfig(model=str(tiny_model_dir), matrices=str(mats), out=str(tmp_path / "ppo"), steps=1,
                   matrices_per_step=2, samples_per_matrix=2, minibatch=4, epochs=1, max_new_tokens=8, lr=1e-3,
                   compile_only=True, device="cpu", eval_every=1, save_every=1, turns=2,
                   skip_no_signal_kl=None)  # compile-only rewards are all alike: step anyway
    r = train_rl(cfg)
    assert r["steps"] == 1
    (m,) = [json.loads(x) for x in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines() if '"losses/' in x]
    assert {"turns/reward_mean_1", "turns/reward_mean_2"} <= set(m)
    # compile-only: nothing ran, so no turn has a correct rate (it used to log 0.0 for turn 2);
    # mutation killed: collect_turns logging turns/correct_rate_T whatever the mode
    assert [k for k in m if "correct" in k] == []
    with pytest.raises(Exception, match="turns must be >= 1"):
        RLConfig(turns=0)


def test_a_refinement_that_failed_for_machine_reasons_is_left_out_of_its_parents_return() -> None:
    """Kills the mutation that scored a machine failure 0 inside its parent's return: the parent
    takes its group's mean valid return in the failed refinement's place; a group with no valid
    refinement adds nothing; and a valid refinement still counts as before."""
    r1 = torch.tensor([1.0, 1.0, -1.0, -1.0])  # two groups (matrices) of two samples
    r2 = torch.tensor([2.0, 0.0, 5.0, 0.0])
    v1 = torch.tensor([True, True, True, True])
    v2 = torch.tensor([True, False, False, False])  # group 1: one refinement lost; group 2: both lost
    g1, g2 = discounted_returns([r1, r2], 0.5, [v1, v2], group_size=2)
    assert g1.tolist() == [1.0 + 0.5 * 2.0, 1.0 + 0.5 * 2.0, -1.0, -1.0]
    assert g2[0].item() == 2.0
    # three turns: a lost middle turn stands in with its group's valid mean return (its reward is unknown)
    r3 = torch.tensor([4.0, 8.0, 0.0, 0.0])
    g = discounted_returns([r1, r2, r3], 0.5, [v1, v2, torch.ones(4, dtype=torch.bool)], group_size=2)
    assert g[1][:2].tolist() == [2.0 + 0.5 * 4.0] * 2
    assert g[0][:2].tolist() == [1.0 + 0.5 * 4.0] * 2
    with pytest.raises(ValueError, match="group_size"):
        discounted_returns([r1, r2], 0.5, [v1, v2])


def test_collect_turns_leaves_a_lost_refinement_out_of_its_parents_score(setup) -> None:
    policy, item = setup
    lost = EvalResult.failure("spmv", None, "m", ErrorKind.INTERNAL, "the worker process died in the prepare phase",
                              compiled=True)
    ev = ScriptedEvaluator([timed(20.0), timed(20.0), timed(10.0), lost])
    cfg = RewardConfig(name="clipped_log", r_eff=1.0, r_pen=0.5, clip=3.0)
    batch = collect_turns(policy, Reference(policy), None, ev, [item], 2, 8, 1.0, cfg, seed=0, turns=2, discount=0.5)
    # both parents ran at 20 us (1.0); the one whose refinement was lost takes the group's valid
    # refinement return (2.0) in its place, not 0, so the two parents score alike
    assert batch.scores.tolist() == pytest.approx([1.0 + 0.5 * 2.0, 1.0 + 0.5 * 2.0, 2.0, 0.0])
    assert batch.valid_mask.tolist() == [True, True, True, False]


def test_a_lost_refinement_takes_its_own_groups_valid_mean() -> None:
    """Two groups of three, the first with two valid refinements, the second with one: each lost one
    stands in with its own group's mean of the valid ones (kills a mean multiplied by the count, and a
    count summed over every group or without its dimension); a group size of one is allowed, and a
    group with nothing valid adds nothing."""
    ones = torch.ones(6, dtype=torch.bool)
    r1 = torch.tensor([1.0, 3.0, 100.0, 2.0, 50.0, 60.0])
    valid1 = torch.tensor([True, True, False, True, False, False])
    g = discounted_returns([torch.zeros(6), r1], 0.5, [ones, valid1], group_size=3)
    assert g[1].tolist() == [1.0, 3.0, 2.0, 2.0, 2.0, 2.0]
    assert g[0].tolist() == [0.5, 1.5, 1.0, 1.0, 1.0, 1.0]
    g = discounted_returns([torch.zeros(2), torch.tensor([4.0, 9.0])], 0.5,
                           [torch.ones(2, dtype=torch.bool), torch.tensor([True, False])], group_size=1)
    assert g[1].tolist() == [4.0, 0.0] and g[0].tolist() == [2.0, 0.0]


def test_concat_keeps_values_sample_logps_and_every_new_best(setup) -> None:
    """Kills a merged batch that drops the value estimates, the sampler's log-probs or the set of raised
    entries (an entry raised in either turn counts once)."""
    from sparserl.rl.rollout import RolloutBatch

    policy, item = setup
    s = item.sample()

    def b(T: int, v: float, bests: frozenset) -> RolloutBatch:
        return RolloutBatch([s], ["t"], torch.ones(1, T, dtype=torch.long), torch.ones(1, T), torch.ones(1, T),
                            torch.ones(1, T), torch.full((1, T), v), torch.ones(1), [timed(10.0)],
                            {"reward/new_best_known": float(len(bests))}, sample_logp=torch.full((1, T), v),
                            new_bests=bests)

    m = concat_batches([b(2, 0.5, frozenset({"a"})), b(3, 0.25, frozenset({"a", "b"}))], pad_id=7)
    assert m.values.tolist() == [[0.5, 0.5, 0.0], [0.25, 0.25, 0.25]]
    assert m.sample_logp.tolist() == [[0.5, 0.5, 0.0], [0.25, 0.25, 0.25]]
    assert m.new_bests == frozenset({"a", "b"}) and m.timings["reward/new_best_known"] == 2.0


def test_collect_turns_passes_its_budget_and_reward_on_and_averages_over_the_valid(setup) -> None:
    """Every turn samples within ``max_new_tokens`` (kills the budget dropped to the automatic one, which
    lets the tiny random policy write hundreds of tokens) and is scored by the given reward config (a
    clip of 1: log2(40/10) = 2 scores 1; kills the default config in its place); a turn whose one
    completion is valid averages over that one (kills a floor of 2 on the count)."""
    from sparserl.harness.result import ErrorKind as K

    policy, item = setup
    lost = EvalResult.failure("spmv", None, "m", K.INTERNAL, "worker died", compiled=True)
    ev = ScriptedEvaluator([timed(10.0), lost, timed(10.0), timed(10.0)])
    cfg = RewardConfig(name="clipped_log", r_eff=1.0, r_pen=0.5, clip=1.0)
    batch = collect_turns(policy, Reference(policy), None, ev, [item], 2, 8, 1.0, cfg, seed=0, turns=2, discount=0.5)
    assert batch.response.shape[1] <= 8
    assert batch.timings["turns/reward_mean_1"] == pytest.approx(1.0)  # one valid completion, clipped to 1
    assert batch.scores.tolist()[2:] == pytest.approx([1.0, 1.0])


def test_the_next_prompt_names_the_task_of_its_own_matrix(setup) -> None:
    """An SpMM item on a rectangular matrix: the refinement prompt's task line names SpMM at its k, the
    matrix's rows and columns in that order and its nonzeros, written out here by hand (kills the op,
    k or nonzeros dropped, and the rows read from the columns); the SpMM kernel is extracted as SpMM."""
    from sparserl.rl.rollout import RolloutBatch

    policy, _ = setup
    A = generate("rectangular", 300, seed=0)
    assert A.shape[0] != A.shape[1]
    inp, card = matrix_entry(A, policy)
    item = MatrixItem("r", A, "r", inp, Op.SPMM, 32, card)
    s = item.sample()
    spmm = KERNEL.replace("spmv_kernel", "spmm_kernel")
    batch = RolloutBatch([s], ["chatter\n```cuda\n" + spmm + "```\n"], torch.zeros(1, 1, dtype=torch.long),
                         torch.ones(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), None, torch.zeros(1), [timed(20.0)])
    (nxt,) = refinement_samples([item], batch)
    want = (f"SpMM Y = A X with k = 32 for the {A.shape[0]} x {A.shape[1]} sparse matrix above "
            f"({A.nnz} nonzeros).")
    assert nxt.prompt.startswith(want + "\n"), nxt.prompt[:200]
    assert "Previous kernel:\n" + spmm.strip() in nxt.prompt and "chatter" not in nxt.prompt


def test_valid_masks_without_a_group_size_are_one_line() -> None:
    """The message a caller reads (kills it altered)."""
    r = [torch.zeros(2), torch.zeros(2)]
    with pytest.raises(ValueError, match=r"^discounted_returns with valid masks needs group_size >= 1$"):
        discounted_returns(r, 0.5, [torch.ones(2, dtype=torch.bool)] * 2, group_size=0)
