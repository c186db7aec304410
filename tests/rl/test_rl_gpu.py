"""GPU: two PPO steps of the real trainer (rl/trainer.train_rl) on a tiny model, rewarded by the real
harness (no double), that must move the policy toward the kernel the harness verifies.

The tiny model (the shape of tests/rl/tiny.py) is first taught, on the GPU, two completions for
every prompt: a library CSR kernel (RIGHT) and the same kernel writing ``-sum`` (WRONG: it
compiles and runs, and the harness's verification rejects it), until its samples are those two
texts. PPO's first batch then holds both verdicts for every matrix, and two steps must raise
log p(RIGHT) - log p(WRONG) by more than MIN_GAIN nats and move the parameters.

Mutation this kills: the learning rate forced to 0 (every optimizer group's lr set to 0 after
``rl.update.set_lr``): the parameters stay where they were and the gap does not rise.
``test_the_learning_check_fails_when_the_learning_rate_is_forced_to_zero`` runs exactly that
mutant through the same trainer and asserts the learning check rejects it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import sparserl.rl.trainer as trainer  # noqa: E402
from sparserl.harness.result import ErrorKind  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.kernels.library import variants  # noqa: E402
from sparserl.matrices import generate, load_matrix, save_matrix  # noqa: E402
from sparserl.model.policy import Policy, make_sample  # noqa: E402
from sparserl.rl.trainer import RLConfig, train_rl  # noqa: E402

from tests.rl.tiny import tiny_policy  # noqa: E402

pytestmark = pytest.mark.gpu

RIGHT = variants("spmv", "CSR")[0].render()
WRONG = RIGHT.replace("y[row] = sum;", "y[row] = -sum;")
MATRICES = (("banded", 1, 3000), ("random", 2, 3000))
TEMPERATURE = 0.7
"""Sampling temperature of the RL run (the taught texts' tokens are near-certain at 0.7; the
choice between them stays open)."""
MIN_GAIN = 0.5
"""Nats by which two PPO steps must raise log p(RIGHT) - log p(WRONG), averaged over the matrices
(a CPU calibration of this recipe, with a stand-in judge, gave +2.4 at lr 1e-4 and exactly 0 at lr 0)."""


def _kind(text: str) -> str:
    return "right" if text.strip() == RIGHT.strip() else "wrong" if text.strip() == WRONG.strip() else "other"


@pytest.fixture(scope="module")
def taught(tmp_path_factory, tiny_tokenizer, tiny_hf_config) -> tuple[Path, Path]:
    """(policy checkpoint, matrix folder): the tiny model taught RIGHT and WRONG for every matrix."""
    assert WRONG != RIGHT
    d = tmp_path_factory.mktemp("rl_gpu")
    mats = [generate(fam, n, seed=seed) for fam, seed, n in MATRICES]
    (d / "matrices").mkdir()
    for (fam, seed, _), A in zip(MATRICES, mats):
        save_matrix(A, d / "matrices" / f"{fam}_{seed}.npz")
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config).to("cuda")
    samples = [make_sample(A, policy.config, Op.SPMV) for A in mats]
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    kinds: Counter = Counter()
    for _ in range(5):  # 400 steps reach a loss near the mixture's floor; more if sampling says not yet
        policy.train()
        for _ in range(400 if not kinds else 200):
            loss = policy.loss([s for s in samples for _ in (0, 1)], [RIGHT, WRONG] * len(samples))
            opt.zero_grad()
            loss.backward()
            opt.step()
        outs = policy.generate(samples * 8, max_new_tokens=len(policy.completion_ids(RIGHT)) + 8,
                               temperature=TEMPERATURE, seed=0)
        kinds = Counter(_kind(o) for o in outs)
        if kinds["right"] and kinds["wrong"] and kinds["other"] <= 2:
            break
    assert kinds["right"] and kinds["wrong"] and kinds["other"] <= 2, (f"the tiny model did not learn the two "
                                                                      f"texts: {kinds}, loss {loss.item():.4f}")
    policy.save(d / "policy")
    return d / "policy", d / "matrices"


def run_ppo(taught, evaluator, out: Path) -> list[dict]:
    """Two PPO steps from the taught policy; the metrics of each step."""
    model, mats = taught
    n = len(Policy.load(model).completion_ids(RIGHT)) + 8
    cfg = RLConfig(algo="ppo", model=str(model), matrices=str(mats), out=str(out), steps=2, matrices_per_step=2,
                   samples_per_matrix=8, minibatch=8, epochs=2, max_new_tokens=n, temperature=TEMPERATURE, lr=1e-4,
                   warmup_steps=0, large_per_family=0, device="cuda", eval_every=2, save_every=2, seed=0)
    train_rl(cfg, evaluator=evaluator)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def learning(taught, out: Path) -> tuple[float, float]:
    """(mean rise of log p(RIGHT) - log p(WRONG) over the matrices, largest parameter change)
    from the taught policy to the checkpoint in ``out``."""
    model, mats = taught
    start, end = Policy.load(model, device="cuda"), Policy.load(out / "checkpoint", device="cuda")
    rises = []
    with torch.no_grad():
        for path in sorted(mats.iterdir()):
            A = load_matrix(path)
            gaps = []
            for p in (start, end):
                p.eval()
                s = make_sample(A, p.config, Op.SPMV)
                lp = [-float(p.loss([s], [t])) * len(p.completion_ids(t)) for t in (RIGHT, WRONG)]
                gaps.append(lp[0] - lp[1])
            rises.append(gaps[1] - gaps[0])
    moved = max(float((a - b).abs().max()) for a, b in zip(start.state_dict().values(), end.state_dict().values()))
    return sum(rises) / len(rises), moved


def learned(rise: float, moved: float) -> bool:
    return rise > MIN_GAIN and moved > 1e-5


def test_two_ppo_steps_with_real_rewards_move_the_policy_toward_the_verified_kernel(taught, loop_evaluator,
                                                                                   tmp_path) -> None:
    # the harness's own verdicts on the two taught texts: what the rewards are made of
    _, mats = taught
    ref = loop_evaluator.register(load_matrix(mats / "banded_1.npz"), "banded_1")
    right, wrong = loop_evaluator.evaluate(RIGHT, ref, Op.SPMV), loop_evaluator.evaluate(WRONG, ref, Op.SPMV)
    assert right.ok and right.speedup > 0, right.message
    assert wrong.compiled and wrong.error_kind is ErrorKind.INCORRECT, (wrong.error_kind, wrong.message)

    metrics = run_ppo(taught, loop_evaluator, tmp_path / "ppo")
    assert [m["step"] for m in metrics] == [1, 2]
    first = metrics[0]
    assert 0.0 < first["reward/correct_rate"] < 1.0, first  # both verdicts in the first batch
    assert first["reward/speedup_geomean"] > 0 and first["charts/no_signal"] == 0.0, first  # correct ones were timed
    assert all(m["reward/compile_rate"] >= 0.75 and m["charts/update_minibatches"] > 0 for m in metrics), metrics
    rise, moved = learning(taught, tmp_path / "ppo")
    assert learned(rise, moved), (rise, moved)


def test_the_learning_check_fails_when_the_learning_rate_is_forced_to_zero(taught, loop_evaluator, tmp_path,
                                                                            monkeypatch) -> None:
    """The mutant: every optimizer group's lr set to 0 after the trainer's set_lr."""
    real = trainer.set_lr

    def zero_lr(optim, cfg, step):
        real(optim, cfg, step)
        for g in optim.opt.param_groups:
            g["lr"] = 0.0
        return 0.0

    monkeypatch.setattr(trainer, "set_lr", zero_lr)
    metrics = run_ppo(taught, loop_evaluator, tmp_path / "ppo_lr0")
    assert 0.0 < metrics[0]["reward/correct_rate"] < 1.0  # the same signal reached the update
    rise, moved = learning(taught, tmp_path / "ppo_lr0")
    assert moved == 0.0 and abs(rise) < 1e-3 and not learned(rise, moved), (rise, moved)
