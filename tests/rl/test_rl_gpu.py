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


def test_a_lora_run_on_the_gpu_keeps_the_trained_adapters_as_its_reference(tiny_model_dir, tiny_tokenizer,
                                                                          loop_evaluator, tmp_path) -> None:
    """RL under LoRA from adapters SFT trained, on the GPU with the real harness: at step 1 the KL to the
    reference is 0 (the reference is the starting policy, not the base with its adapters off), the
    starting adapters are saved bit for bit beside the moved ones, and after a resume the reference
    rebuilt from them gives the starting policy's log-probs on the GPU.

    Mutations this kills: the reference taken with the adapters off (``disable_adapter``: the step-1 KL
    is the live-versus-base gap, checked here to be far above the bound); the saved reference adapters
    taken from the live policy at save time (not equal to the starting ones once the update moved them)."""
    from sparserl.encoding import EncodingConfig
    from sparserl.model.policy import LoraSpec, PolicyConfig
    from sparserl.rl.rollout import response_mask, token_logprobs
    from sparserl.rl.update import Reference, adapter_weights

    pcfg = PolicyConfig(encoding=EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2),
                        lora=LoraSpec(r=4, alpha=8, dropout=0.0))
    start = Policy.from_pretrained(tiny_model_dir, pcfg)
    torch.manual_seed(1)
    with torch.no_grad():  # what SFT leaves: adapters that change the model
        for n, p in start.lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    start.save(tmp_path / "start")
    mats = tmp_path / "matrices"
    mats.mkdir()
    for fam, seed, n in MATRICES:
        save_matrix(generate(fam, n, seed=seed), mats / f"{fam}_{seed}.npz")

    def cfg(steps: int, resume: bool) -> RLConfig:
        return RLConfig(algo="grpo", model=str(tmp_path / "start"), matrices=str(mats), out=str(tmp_path / "rl"),
                        steps=steps, matrices_per_step=2, samples_per_matrix=2, minibatch=4, epochs=1,
                        max_new_tokens=16, lr=1e-2, warmup_steps=0, large_per_family=0, device="cuda",
                        eval_every=100, save_every=1, seed=0, resume=resume, skip_no_signal_kl=None,
                        entropy_coef=0.05)  # random adapters earn equal rewards: the entropy term moves them

    train_rl(cfg(2, False), evaluator=loop_evaluator)
    metrics = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in metrics if m.get("step") == 1 and "charts/kl_to_ref" in m)

    # the gap that a reference with the adapters off would show, on the same GPU
    start = Policy.load(tmp_path / "start", device="cuda").eval()
    samples = [make_sample(load_matrix(p), start.config, Op.SPMV) for p in sorted(mats.iterdir())]
    ids = start.generate_ids(samples, max_new_tokens=16, temperature=1.0, seed=3)
    mask = response_mask(ids, tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        live = token_logprobs(start.response_forward(samples, ids, mask)[0], ids)
        with start.lm.disable_adapter():
            base = token_logprobs(start.response_forward(samples, ids, mask)[0], ids)
    off_gap = float(((live - base).abs() * mask).sum() / mask.float().sum())
    assert off_gap > 0.05, f"the adapters must change the model for this test ({off_gap})"
    assert abs(first["charts/kl_to_ref"]) < 1e-4 < off_gap / 100, (first["charts/kl_to_ref"], off_gap)

    state = torch.load(tmp_path / "rl" / "state.pt", map_location="cpu", weights_only=False)
    started = {n: t.cpu() for n, t in adapter_weights(start).items()}
    moved = Policy.load(tmp_path / "rl" / "checkpoint", device="cuda").eval()
    now = {n: t.cpu() for n, t in adapter_weights(moved).items()}
    assert set(state["ref_adapters"]) == set(started) == set(now)
    assert all(torch.equal(state["ref_adapters"][n].cpu(), started[n]) for n in started)
    assert any(not torch.equal(now[n], started[n]) for n in started), "two steps must move the adapters"

    train_rl(cfg(3, True), evaluator=loop_evaluator)
    steps = [json.loads(line).get("step") for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(3) >= 1 and max(s for s in steps if s is not None) == 3
    state = torch.load(tmp_path / "rl" / "state.pt", map_location="cpu", weights_only=False)
    assert all(torch.equal(state["ref_adapters"][n].cpu(), started[n]) for n in started)
    resumed = Policy.load(tmp_path / "rl" / "checkpoint", device="cuda").eval()
    ref = Reference(resumed, encoder_state=state["ref_encoder"], adapter_state=state["ref_adapters"])
    assert torch.allclose(ref(samples, ids, mask) * mask, live * mask, atol=1e-4)
