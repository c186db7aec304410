"""The learner (rl/update.py) on a tiny random policy (CPU): it agrees with the sampler, its critic
cannot drag the policy, infrastructure failures stay out, the KL loss covers every token, the
update stops at the target KL, and the exploration options move the policy the right way."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.harness.result import ErrorKind, EvalResult  # noqa: E402
from sparserl.rl import core  # noqa: E402
from sparserl.rl.config import RLConfig  # noqa: E402
from sparserl.rl.rollout import token_logprobs, train_mode  # noqa: E402
from sparserl.rl.update import (  # noqa: E402
    ActorCritic,
    Plan,
    ValueHead,
    advantages,
    build_optimizer,
    minibatch_loss,
    set_lr,
    warmup_factor,
)

from tests.rl.tiny import rollout, run_update, seq_logp, tiny_policy, tiny_samples  # noqa: E402

CPU = torch.device("cpu")


def lora_policy(tiny_tokenizer, tiny_hf_config, dropout: float = 0.5):
    """A LoRA policy whose adapters are not zero (PEFT starts B at 0, where dropout changes nothing)."""
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config, lora=True, dropout=dropout)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return policy


def test_sampler_and_learner_log_probs_agree(tiny_tokenizer, tiny_hf_config) -> None:
    """The log-probs the sampler drew its tokens with, the learner's at rollout time (old_logp) and
    the learner's in the update's first forward are the same numbers: same temperature, same
    precision, dropout off. Each of the three old disagreements, put back, breaks it."""
    policy = lora_policy(tiny_tokenizer, tiny_hf_config, dropout=0.5)
    T = 0.7
    batch = rollout(policy, None, tiny_samples(policy), torch.zeros(4), temperature=T, max_new_tokens=12)
    m = batch.mask.bool()
    assert m.sum() > 8
    gap = (batch.sample_logp - batch.old_logp).abs()[m]
    assert float(gap.max()) < 1e-4, float(gap.max())
    cfg = RLConfig(algo="grpo", samples_per_matrix=4, minibatch=4, temperature=T, device="cpu")
    model = ActorCritic(policy, None)
    plan = Plan.of(cfg, batch, None, 0.0)
    idx = torch.arange(4)
    with train_mode(model):  # the update's mode: training, dropout off
        _, _, st = minibatch_loss(cfg, model, batch, idx, torch.zeros_like(batch.mask), None, plan, CPU)
    assert st["losses/approx_kl"] < 1e-9
    # the old ways, each on its own: dropout on in the update, no temperature, bf16 learner
    policy.train()
    _, _, st = minibatch_loss(cfg, model, batch, idx, torch.zeros_like(batch.mask), None, plan, CPU)
    assert st["losses/approx_kl"] > 1e-4
    policy.eval()
    with torch.no_grad():
        logits, _ = policy.response_forward(batch.samples, batch.response, batch.mask)
        untempered = token_logprobs(logits, batch.response)
        bf16 = token_logprobs(logits.bfloat16(), batch.response, temperature=T)
    assert float((untempered - batch.sample_logp).abs()[m].max()) > 0.05
    assert float((bf16 - batch.sample_logp).abs()[m].max()) > 1e-3


def test_the_critic_cannot_drag_the_policy(tiny_tokenizer, tiny_hf_config) -> None:
    """Scores x1 and x1000 whiten to the same advantages but give value losses a million times
    apart. The policy ends the update in the same place: the critic reads detached hidden states
    and has its own gradient clip (one clip over both heads scaled the policy's gradient down by
    the value loss)."""
    scores = torch.tensor([1.0, -0.5, 2.0, 0.0])
    finals, value_losses = [], []
    for scale in (1.0, 1000.0):
        policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
        vh = ValueHead(tiny_hf_config.hidden_size)
        batch = rollout(policy, vh, tiny_samples(policy), scores * scale)
        cfg = RLConfig(algo="ppo", critic=True, samples_per_matrix=4, minibatch=2, epochs=2, lr=1e-3, target_kl=None,
                       pg_token_share=1.0, kl_loss_coef=0.0, device="cpu")
        _, _, stats = run_update(cfg, policy, vh, batch)
        finals.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
        value_losses.append(stats["losses/value_loss"])
    assert value_losses[1] > 1e4 * value_losses[0]
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-3, atol=1e-5)  # float noise of the whitening only


def test_the_critic_learns_at_its_own_lr(tiny_tokenizer, tiny_hf_config) -> None:
    """Two matrices with different rewards (no baseline): at the critic's own lr its explained
    variance rises well above 0 in a few updates on the batch; at the policy's lr (the old
    setting) it stays near 0."""
    samples = tiny_samples(tiny_policy(tiny_tokenizer, tiny_hf_config), ("banded", "banded", "powerlaw", "powerlaw"))
    ev = {}
    for vf_lr in (1e-5, 1e-1):
        policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
        vh = ValueHead(tiny_hf_config.hidden_size)
        batch = rollout(policy, vh, samples, torch.tensor([2.0, 2.0, -1.0, -1.0]))
        cfg = RLConfig(algo="ppo", critic=True, samples_per_matrix=2, minibatch=4, epochs=10, lr=1e-6, vf_lr=vf_lr,
                       vf_clip=None,
                       score_baseline="none", target_kl=None, kl_loss_coef=0.0, device="cpu")
        _, returns, _ = run_update(cfg, policy, vh, batch)
        with torch.no_grad():
            _, h = policy.response_forward(batch.samples, batch.response, batch.mask, hidden=True)
            ev[vf_lr] = float(core.explained_variance(vh(h) * batch.mask, returns, batch.mask))
    assert ev[1e-1] > 0.5 and ev[1e-5] < 0.05, ev


def test_optimizer_groups_and_warmup(tiny_tokenizer, tiny_hf_config) -> None:
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    vh = ValueHead(tiny_hf_config.hidden_size)
    cfg = RLConfig(lr=2e-5, vf_lr=1e-3, warmup_steps=4)
    optim = build_optimizer(policy, vh, cfg)
    assert [g["lr"] for g in optim.opt.param_groups] == [2e-5, 1e-3]
    assert len(optim.params) == len(optim.policy_params) + 2
    lrs = [set_lr(optim, cfg, s) for s in range(6)]
    assert lrs == pytest.approx([5e-6, 1e-5, 1.5e-5, 2e-5, 2e-5, 2e-5])
    assert optim.opt.param_groups[1]["lr"] == pytest.approx(1e-3)
    assert warmup_factor(0, 0) == 1.0 and warmup_factor(0, 10) == pytest.approx(0.1)


def test_update_stops_at_the_target_kl(tiny_tokenizer, tiny_hf_config) -> None:
    """The first minibatch is applied (the policy is where it sampled); once it has moved past
    target_kl the remaining minibatches and epochs are skipped, and the log says so."""
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    batch = rollout(policy, None, tiny_samples(policy), torch.tensor([1.0, -1.0, 1.0, -1.0]))
    cfg = RLConfig(algo="grpo", samples_per_matrix=4, minibatch=1, epochs=3, lr=1e-2, target_kl=1e-6,
                   pg_token_share=1.0, device="cpu")
    _, _, stats = run_update(cfg, policy, None, batch)
    assert stats["charts/early_stop"] == 1.0 and stats["charts/update_minibatches"] == 1.0
    free = dataclasses.replace(cfg, target_kl=None)
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    _, _, stats = run_update(free, policy, None, rollout(policy, None, tiny_samples(policy), batch.scores))
    assert stats["charts/early_stop"] == 0.0 and stats["charts/update_minibatches"] == 12.0


@pytest.mark.parametrize("share", [1.0, 0.05])
def test_kl_loss_pulls_every_token_back(share: float, tiny_tokenizer, tiny_hf_config) -> None:
    """A policy that has drifted from its reference, all rewards equal (no policy-gradient signal):
    the KL loss on every response token brings it back, even when the policy gradient covers only
    5% of the tokens. Without it nothing holds it (the lr 5e-5 collapse)."""
    from sparserl.rl.update import Reference

    drift = {}
    for coef in (0.0, 1.0):
        policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
        samples = tiny_samples(policy)
        ref = Reference(policy)
        with torch.no_grad():  # drift away from the reference
            g = torch.Generator().manual_seed(1)
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        batch = rollout(policy, None, samples, torch.zeros(4), max_new_tokens=16)
        batch = dataclasses.replace(batch, ref_logp=ref(samples, batch.response, batch.mask) * batch.mask)
        before = float(core.masked_mean(core.kl_loss_terms(batch.old_logp, batch.ref_logp), batch.mask))
        cfg = RLConfig(algo="grpo", samples_per_matrix=4, minibatch=4, epochs=5, lr=3e-3, kl_loss_coef=coef,
                       pg_token_share=share, target_kl=None, device="cpu")
        run_update(cfg, policy, None, batch)
        with torch.no_grad():
            logits, _ = policy.response_forward(samples, batch.response, batch.mask)
            now = token_logprobs(logits, batch.response) * batch.mask
        drift[coef] = float(core.masked_mean(core.kl_loss_terms(now, batch.ref_logp), batch.mask)) / before
    assert drift[0.0] == pytest.approx(1.0, abs=1e-6)  # no signal, no KL loss: nothing moves
    assert drift[1.0] < 0.7, drift


def test_fixed_token_counts(tiny_tokenizer, tiny_hf_config) -> None:
    """The policy-gradient sum is divided by the batch's selected-token count scaled to a
    minibatch, the same for every minibatch (not by each minibatch's own count)."""
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    batch = rollout(policy, None, tiny_samples(policy), torch.tensor([1.0, -1.0, 1.0, -1.0]), max_new_tokens=16)
    cfg = RLConfig(algo="grpo", samples_per_matrix=4, minibatch=2, pg_token_share=0.25, device="cpu")
    plan = Plan.of(cfg, batch, None, 0.05)
    assert plan.pg_denom == pytest.approx(float(plan.pg_mask.sum()) / 2)
    assert plan.all_denom == pytest.approx(float(batch.mask.sum()) / 2)
    per_row = plan.pg_mask.sum(1)
    assert all(int(per_row[b]) == max(1, round(0.25 * float(batch.mask[b].sum()))) for b in range(4))


def test_infrastructure_failures_stay_out_of_update_and_baselines() -> None:
    """collect marks results of the machine's failures invalid: masked, scored 0, nobody's baseline."""
    from sparserl.rl.rollout import RolloutBatch

    B, T = 6, 5
    mask = torch.ones(B, T)
    valid = torch.tensor([True, True, False, True, True, True])
    mask[2] = 0
    scores = torch.tensor([1.0, 0.0, 0.0, 2.0, 0.0, 1.0])
    batch = RolloutBatch([None] * B, [""] * B, torch.zeros(B, T, dtype=torch.long), mask, torch.zeros(B, T),
                         torch.zeros(B, T), torch.zeros(B, T), scores, [], valid=valid)
    for cfg in (RLConfig(algo="grpo", samples_per_matrix=3, grpo_baseline="loo", whiten_advantages=False),
                RLConfig(algo="ppo", samples_per_matrix=3, whiten_advantages=False)):
        adv, _ = advantages(cfg, batch)
        assert float(adv[2].abs().max()) == 0
        torch.testing.assert_close(adv[:2, 0], torch.tensor([1.0, -1.0]))  # the pair's own baseline
        torch.testing.assert_close(adv[3:, 0], core.loo_centred(scores[3:], 3))


def test_collect_drops_infrastructure_failures(tiny_tokenizer, tiny_hf_config, caplog) -> None:
    from sparserl.kernels.contract import Op
    from sparserl.rewards import RewardConfig
    from sparserl.rl.rollout import MatrixItem, collect, matrix_entry
    from sparserl.rl.update import Reference

    from tests.rl.tiny import ScriptedEvaluator

    def failed(kind: ErrorKind) -> EvalResult:
        return EvalResult.failure("spmv", None, "m", kind, "boom", compiled=True)

    flaky = ScriptedEvaluator([failed(ErrorKind.INCORRECT), failed(ErrorKind.INTERNAL), failed(ErrorKind.INCORRECT)])
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    from sparserl.matrices import generate

    A = generate("banded", 200, seed=0)
    inp, card = matrix_entry(A, policy)
    item = MatrixItem("m", A, "m", inp, Op.SPMV, None, card)
    with caplog.at_level(logging.WARNING):
        batch = collect(policy, Reference(policy), None, flaky, [item], 3, 8, 1.0, RewardConfig(), seed=0)
    assert batch.valid.tolist() == [True, False, True] and float(batch.mask[1].sum()) == 0
    assert float(batch.mask[0].sum()) > 0 and batch.scores[1] == 0 and batch.scores[0] == -3.5
    assert "reasons of the machine" in caplog.text


def test_no_signal_is_logged(caplog) -> None:
    from sparserl.rl.rollout import RolloutBatch
    from sparserl.rl.trainer import _signal_warning, batch_metrics

    B, T = 4, 3
    res = [EvalResult.failure("spmv", None, "m", ErrorKind.INCORRECT, "", compiled=True)] * B
    mk = lambda s: RolloutBatch([None] * B, [""] * B, torch.zeros(B, T, dtype=torch.long), torch.ones(B, T),  # noqa: E731
                                torch.zeros(B, T), torch.zeros(B, T), None, s, res)
    cfg = RLConfig(algo="grpo", samples_per_matrix=2)
    flat = batch_metrics(mk(torch.full((B,), -3.5)), cfg)
    assert flat["charts/no_signal"] == 1.0 and flat["reward/uniform_group_share"] == 1.0
    some = batch_metrics(mk(torch.tensor([-3.5, -3.5, 0.0, 1.0])), cfg)
    assert some["charts/no_signal"] == 0.0 and some["reward/uniform_group_share"] == 0.5

    from sparserl.kernels.library import get_variant

    two = get_variant("spmv/bsr_group/R=2,C=2/g=32,block=128").render()
    other = two.replace("FORMAT: BSR R=2 C=2", "FORMAT: BSR R=2 C=4")  # the library body with other numbers
    mixed = two.replace("grid=ceil_div(mb, BLOCK / G)", "grid=ceil_div(mb, 4)")  # a LAUNCH line it never has
    texts = RolloutBatch([None] * B, [two, mixed, other, "junk"], torch.zeros(B, T, dtype=torch.long),
                         torch.ones(B, T), torch.zeros(B, T), torch.zeros(B, T), None, torch.zeros(B), res)
    m = batch_metrics(texts, cfg)
    assert (m["samples/library_share"], m["samples/params_share"], m["samples/mismatch_share"],
            m["samples/new_share"]) == (0.25, 0.25, 0.25, 0.25)
    assert flat["samples/new_share"] == 1.0  # empty completions

    class R:
        step = 7

    with caplog.at_level(logging.WARNING):
        _signal_warning(R(), flat)
    assert "no policy gradient" in caplog.text and "step 7" in caplog.text


@pytest.mark.parametrize("options", [
    dict(algo="grpo", grpo_baseline="loo"),
    dict(algo="grpo", grpo_baseline="loo", best_of_k=2),
    dict(algo="ppo", critic=True),
    dict(algo="ppo", best_of_k=3),
    dict(algo="grpo", entropy_coef=0.01),
    dict(algo="grpo", kl_cov_share=0.2),
    dict(algo="grpo", kl_loss="k3"),
])
def test_options_move_toward_rewarded_completions(options: dict, tiny_tokenizer, tiny_hf_config) -> None:
    """Every exploration option still moves the policy toward the better completions (with best of
    k, toward the best: distinct rewards, as in a group where all 3-subsets hold a 1 max@3 is flat)."""
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    vh = ValueHead(tiny_hf_config.hidden_size) if options.get("critic") else None
    batch = rollout(policy, vh, tiny_samples(policy), torch.tensor([2.0, -1.0, 1.0, -2.0]))
    lp0 = seq_logp(policy, batch)
    cfg = RLConfig(samples_per_matrix=4, minibatch=4, epochs=3, lr=1e-3, device="cpu", pg_token_share=1.0,
                   target_kl=None, **options)
    _, _, stats = run_update(cfg, policy, vh, batch)
    gain = seq_logp(policy, batch) - lp0
    assert float(gain[[0, 2]].mean()) > float(gain[[1, 3]].mean()) + 0.1, gain
    assert np.isfinite(list(stats.values())).all()


def test_config_rejects_bad_combinations() -> None:
    with pytest.raises(SparseRLError, match="leave-one-out"):
        RLConfig(algo="grpo", grpo_baseline="mean_std", best_of_k=2)
    with pytest.raises(SparseRLError, match="best_of_k"):
        RLConfig(algo="grpo", grpo_baseline="loo", samples_per_matrix=4, best_of_k=5)
    with pytest.raises(SparseRLError, match="kl_loss_coef"):
        RLConfig(algo="grpo", kl_coef=0.05)
    with pytest.raises(SparseRLError, match="temperature"):
        RLConfig(temperature=0.0)
    with pytest.raises(SparseRLError, match="critic"):
        RLConfig(algo="ppo", score_baseline="none")
    with pytest.raises(SparseRLError, match="kl_loss"):
        RLConfig(kl_loss="k1")
    assert RLConfig(critic=True).uses_critic and not RLConfig().uses_critic
    assert not RLConfig(algo="grpo", critic=True).uses_critic


def test_large_matrices_join_the_pool(tiny_tokenizer, tiny_hf_config) -> None:
    from sparserl.matrices.generators import family_names
    from sparserl.rl.trainer import large_items

    class Ev:
        def register(self, A, name):
            return name

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    items = large_items(RLConfig(large_per_family=1, large_rows=400, compile_only=True), Ev(), policy)
    assert len(items) == len(family_names()) and all(200 <= it.A.shape[0] <= 800 for it in items)  # grids round
    assert len({it.name for it in items}) == len(items)
    assert large_items(RLConfig(compile_only=True, large_rows=400), Ev(), policy) == []  # auto: none without a GPU
    assert RLConfig().large_per_family is None and RLConfig().large_rows == 1_000_000
