"""PPO and GRPO end to end on a tiny model with compile-only rewards (CPU): the loop runs,
parameters change, metrics are logged, checkpoints resume, config files load, and the
paper-compatible entry point works."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.harness.compile import find_nvcc  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402
from sparserl.rl.rollout import response_mask  # noqa: E402
from sparserl.rl.trainer import RLConfig, load_config_file, train_rl  # noqa: E402

from tests.rl.tiny import rollout, run_update, seq_logp, tiny_policy, tiny_samples  # noqa: E402

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


@pytest.fixture(scope="module")
def mats(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mats")
    for i, fam in enumerate(("banded", "random", "stencil2d")):
        save_matrix(generate(fam, 300, seed=i), d / f"{fam}.npz")
    return d


def base(tiny_model_dir: Path, mats: Path, out: Path, **kw) -> RLConfig:
    return RLConfig(**({"model": str(tiny_model_dir), "matrices": str(mats), "out": str(out), "steps": 2,
                        "matrices_per_step": 2, "samples_per_matrix": 2, "minibatch": 2, "epochs": 1,
                        "max_new_tokens": 12, "lr": 1e-3, "compile_only": True, "device": "cpu",
                        "eval_every": 2, "save_every": 1,
                        "skip_no_signal_kl": None} | kw))  # compile-only rewards are all alike: step anyway


def test_logprobs_and_entropy_match_the_whole_batch_formulas() -> None:
    from sparserl.rl.core import entropy_from_logits
    from sparserl.rl.rollout import logprobs_and_entropy, token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 5, 11, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 11, (7, 5), generator=g)
    lp, ent = logprobs_and_entropy(logits, ids, rows=3)  # chunks of 3, 3 and 1 rows
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (7, 5)
    whole = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[..., None]).squeeze(-1)
    assert torch.allclose(lp, whole) and torch.allclose(ent, entropy_from_logits(logits))
    assert torch.equal(token_logprobs(logits, ids, rows=3), lp) and torch.equal(token_logprobs(logits, ids), lp)
    # the chunked log-probs keep their gradient (the PPO update differentiates through them)
    leaf = logits.float().requires_grad_()
    token_logprobs(leaf, ids, rows=3).sum().backward()
    want = torch.autograd.grad(torch.log_softmax(leaf, -1).gather(-1, ids[..., None]).sum(), leaf)[0]
    assert torch.allclose(leaf.grad, want)


def test_response_mask() -> None:
    ids = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 7, 2, 0], [5, 6, 7, 8, 9]])
    m = response_mask(ids, eos_id=2, pad_id=0)
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_rl_loop_runs_and_resumes(algo: str, tiny_model_dir: Path, mats: Path, tmp_path: Path) -> None:
    """The loop on compile-only rewards: metrics, warm-up, checkpoint, resume. (Learning is shown in
    test_learning.py, on a reward the tiny model can earn.) Each step's mean reward is what the
    ladder gives its compile rate: -4 for a sample that does not compile, -3.5 for one that does
    (compiled, not run: the wrong rung, c = 3, step 0.5); a miscounted compile rate or a misplaced
    rung breaks the identity."""
    from sparserl.model.policy import Policy

    r = train_rl(base(tiny_model_dir, mats, tmp_path / algo, algo=algo, critic=algo == "ppo"))  # PPO: with a critic
    assert r["steps"] == 2
    metrics = [json.loads(l) for l in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    rows = [m for m in metrics if "reward/mean" in m]
    assert len(rows) == 2 and all(m["reward/mean"] == pytest.approx(-4 + 0.5 * m["reward/compile_rate"]) for m in rows)
    assert r["reward/compile_rate"] == rows[-1]["reward/compile_rate"]
    keys = set().union(*metrics)
    assert {"losses/policy_loss", "losses/clipfrac", "losses/approx_kl", "losses/entropy", "charts/kl_to_ref",
            "charts/samples_per_s", "time/generate", "time/harness_wait", "time/update"} <= keys
    assert {"losses/kl_loss", "rollout/logp_gap", "charts/no_signal", "reward/uniform_group_share",
            "reward/infra_failure_share", "charts/lr", "charts/update_minibatches"} <= keys
    if algo == "ppo":
        assert {"losses/value_loss", "losses/explained_variance", "charts/value_grad_norm"} <= keys
    # compile-only: compile rates, and no correct rate (nothing was run: it read 0.0 in the summary)
    assert "reward/compile_rate" in keys
    assert [k for k in keys | set(r) if "correct" in k] == []
    lrs = [m["charts/lr"] for m in metrics if "charts/lr" in m]
    assert lrs == pytest.approx([1e-4, 2e-4])  # warm-up: lr 1e-3 over 10 steps
    assert Policy.load(tmp_path / algo / "checkpoint").config.encoding == Policy.from_pretrained(tiny_model_dir).config.encoding
    r2 = train_rl(base(tiny_model_dir, mats, tmp_path / algo, algo=algo, steps=3, resume=True, critic=algo == "ppo"))
    steps = [json.loads(l)["step"] for l in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert r2["steps"] == 3 and steps[-1] == 3 and steps.count(3) == 1


@pytest.mark.parametrize("algo,share", [("ppo", 1.0), ("grpo", 1.0), ("ppo", 0.3), ("grpo", 0.3)])
def test_update_moves_toward_rewarded_completions(algo: str, share: float, tiny_tokenizer, tiny_hf_config) -> None:
    """With rewards +1/-1 on alternating completions, one update raises the log-likelihood of
    the rewarded ones relative to the penalised ones (the learning signal, not noise), also
    when only the highest-entropy 30% of the tokens carry the policy gradient."""
    from sparserl.rl.update import pg_token_mask

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    vh = None  # PPO's default has no critic (test_update covers the critic)
    batch = rollout(policy, vh, tiny_samples(policy), torch.tensor([1.0, -1.0, 1.0, -1.0]))
    lp0 = seq_logp(policy, batch)
    cfg = RLConfig(algo=algo, samples_per_matrix=4, minibatch=4, epochs=3, lr=1e-3, kl_loss_coef=0.0, device="cpu",
                   pg_token_share=share, target_kl=None)
    _, _, stats = run_update(cfg, policy, vh, batch)
    gain = seq_logp(policy, batch) - lp0
    assert float(gain[[0, 2]].mean()) > float(gain[[1, 3]].mean()) + 0.1, gain
    assert stats["charts/update_minibatches"] == 3
    if share < 1.0:
        sel = pg_token_mask(cfg, batch)
        assert all(int(sel[b].sum()) == max(1, round(share * float(batch.mask[b].sum()))) for b in range(4))
        with pytest.raises(SparseRLError, match="entropies"):
            run_update(cfg, policy, vh, dataclasses.replace(batch, entropy=None))


def test_ppo_group_baseline_learns_on_the_hard_matrix(tiny_tokenizer, tiny_hf_config) -> None:
    """Two matrices whose rewards differ by a large offset (an easy and a hard one), two samples
    each, the first of each pair the better kernel. With the per-matrix baseline, one PPO update
    raises the better sample on the *hard* matrix too; the offset alone must not decide."""
    from sparserl.rl.update import ValueHead, advantages

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    vh = ValueHead(tiny_hf_config.hidden_size)
    samples = tiny_samples(policy, ("banded", "banded", "powerlaw", "powerlaw"))
    scores = torch.tensor([3.0, 2.0, -2.0, -3.0])  # easy: better, worse; hard: better, worse
    batch = rollout(policy, vh, samples, scores)
    lp0 = seq_logp(policy, batch)
    cfg = RLConfig(algo="ppo", critic=True, samples_per_matrix=2, minibatch=4, epochs=3, lr=1e-3, kl_loss_coef=0.0,
                   device="cpu", pg_token_share=1.0, target_kl=None)  # every token: this test is about the baseline
    assert cfg.score_baseline == "group"
    adv, _, _ = run_update(cfg, policy, vh, batch)
    first_adv = adv[torch.arange(4), batch.mask.long().argmax(1)]
    assert first_adv[2] > 0 > first_adv[3], "the better kernel on the hard matrix gets a positive advantage"
    gain = seq_logp(policy, batch) - lp0
    assert float(gain[2]) > float(gain[3]) + 0.1 and float(gain[0]) > float(gain[1]) + 0.1, gain
    # the textbook score, by contrast, hands both samples of the hard matrix a negative advantage
    plain = advantages(RLConfig(algo="ppo", critic=True, samples_per_matrix=2, score_baseline="none", device="cpu"),
                       batch)[0]
    mask = batch.mask
    assert float(plain[2, mask[2].bool()].mean()) < 0 and float(plain[3, mask[3].bool()].mean()) < 0


@pytest.mark.parametrize("lora", [False, True])
def test_reference_after_resume_is_the_starting_policy(lora: bool, tiny_tokenizer, tiny_hf_config) -> None:
    """After a resume the live policy has moved; the KL reference must still be where the run began."""
    import copy

    from sparserl.encoding import EncodingConfig
    from sparserl.kernels.contract import Op
    from sparserl.model.policy import LoraSpec, Policy, PolicyConfig, make_sample
    from sparserl.rl.rollout import token_logprobs
    from sparserl.rl.update import Reference, adapter_weights

    enc = EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2)
    pcfg = PolicyConfig(encoding=enc, lora=LoraSpec(r=4, alpha=8) if lora else None)
    start = Policy.from_config(tiny_hf_config, tiny_tokenizer, pcfg, seed=0)
    A = generate("banded", 200, seed=0)
    samples = [make_sample(A, pcfg, Op.SPMV)] * 2
    ids = start.generate_ids(samples, max_new_tokens=8, temperature=1.0, seed=1)
    mask = response_mask(ids, tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)
    expected = Reference(start)(samples, ids, mask)
    start_encoder = copy.deepcopy(start.encoder.state_dict())
    moved = copy.deepcopy(start).eval()  # stands for the policy restored from a later checkpoint (no dropout)
    with torch.no_grad():
        for p in moved.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    with torch.no_grad():
        live = token_logprobs(moved.response_forward(samples, ids, mask)[0], ids)
    assert not torch.allclose(live, expected, atol=1e-3)
    ref = (Reference(moved, encoder_state=start_encoder, adapter_state=adapter_weights(start)) if lora
           else Reference(moved, frozen=start))
    assert torch.allclose(ref(samples, ids, mask), expected, atol=1e-5)
    with torch.no_grad():  # the live policy is as it was after the reference pass (its adapters put back)
        assert torch.equal(token_logprobs(moved.response_forward(samples, ids, mask)[0], ids), live)


def test_a_lora_run_from_trained_adapters_has_them_as_its_reference(tiny_tokenizer, tiny_hf_config) -> None:
    """RL from a LoRA checkpoint SFT trained (its adapters not zero): at step 0 the reference is the policy
    itself (KL 0), not the pre-SFT base that turning the adapters off gives, and the reference pass leaves
    the live adapters bit for bit as they were. Kills: the reference taken with the adapters off (a mean gap of
    about 0.06 nats from step 0), the live adapters not put back after the pass."""
    from sparserl.encoding import EncodingConfig
    from sparserl.kernels.contract import Op
    from sparserl.model.policy import LoraSpec, Policy, PolicyConfig, make_sample
    from sparserl.rl.rollout import token_logprobs
    from sparserl.rl.update import Reference, adapter_weights

    pcfg = PolicyConfig(encoding=EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2), lora=LoraSpec(r=4, alpha=8))
    policy = Policy.from_config(tiny_hf_config, tiny_tokenizer, pcfg, seed=0)
    torch.manual_seed(1)
    with torch.no_grad():  # what SFT leaves: adapters that change the model
        for n, p in policy.lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    samples = [make_sample(generate("banded", 200, seed=0), pcfg, Op.SPMV)] * 2
    ids = policy.generate_ids(samples, max_new_tokens=8, temperature=1.0, seed=1)
    mask = response_mask(ids, tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)
    before = adapter_weights(policy)
    policy.eval()  # no adapter dropout: the reference pass runs in eval mode too
    with torch.no_grad():
        live = token_logprobs(policy.response_forward(samples, ids, mask)[0], ids)
        with policy.lm.disable_adapter():
            base = token_logprobs(policy.response_forward(samples, ids, mask)[0], ids)
    assert float(((live - base).abs() * mask).max()) > 1e-3, "the adapters must change the model for this test"
    ref = Reference(policy)(samples, ids, mask)
    assert torch.allclose(ref * mask, live * mask, atol=1e-5)
    after = adapter_weights(policy)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_refuses_without_gpu_unless_compile_only(tiny_model_dir: Path, mats: Path, tmp_path: Path) -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible")
    with pytest.raises(SparseRLError, match="compile-only"):
        train_rl(base(tiny_model_dir, mats, tmp_path / "x", compile_only=False))


def test_config_files(tmp_path: Path) -> None:
    f = tmp_path / "ppo.toml"
    f.write_text('algo = "grpo"\nsteps = 7\nsamples_per_matrix = 4\nops = ["spmv", "spmm"]\n[reward]\nname = "paper"\n')
    cfg = load_config_file(f, steps=9)
    assert cfg.algo == "grpo" and cfg.steps == 9 and cfg.ops == ("spmv", "spmm") and cfg.reward.name == "paper"
    f.write_text("stepz = 3\n")
    with pytest.raises(SparseRLError, match="unknown settings"):
        load_config_file(f)
    with pytest.raises(SparseRLError, match="group"):
        RLConfig(algo="grpo", samples_per_matrix=1)


def test_cli_flags_not_given_leave_the_config_file(tmp_path: Path) -> None:
    """`sparserl ppo --config F` keeps F's booleans and out; a flag given overrides F."""
    from sparserl.cli.rl import rl_config

    f = tmp_path / "run.toml"
    f.write_text('compile_only = true\nresume = true\nsteps = 5\nout = "elsewhere"\n')
    none = dict.fromkeys(("model", "matrices", "out", "steps", "resume", "compile_only"))
    cfg = rl_config("ppo", f, none)
    assert cfg.compile_only and cfg.resume and cfg.steps == 5 and cfg.out == "elsewhere" and cfg.algo == "ppo"
    cfg = rl_config("grpo", f, none | {"compile_only": False, "steps": 2})
    assert not cfg.compile_only and cfg.steps == 2 and cfg.algo == "grpo"
    assert rl_config("ppo", None, none).out == "runs/ppo" and not rl_config("ppo", None, none).resume


def test_train_minimal_entry_point(tiny_model_dir: Path, tmp_path: Path) -> None:
    from sparserl.train_minimal import main

    assert main(["--steps", "1", "--max-nnz", "128", "--model-path", str(tiny_model_dir), "--tokenizer-path",
                 str(tiny_model_dir), "--out", str(tmp_path / "tm"), "--max-new-tokens", "8", "--compile-only"]) == 0
    assert (tmp_path / "tm" / "checkpoint" / "policy.json").exists()


def test_shipped_configs_load() -> None:
    root = Path(__file__).resolve().parents[2] / "configs"
    assert load_config_file(root / "ppo.toml").algo == "ppo"
    assert load_config_file(root / "grpo.toml").samples_per_matrix == 8


def test_a_step_without_reward_signal_is_skipped(tiny_model_dir: Path, mats: Path, tmp_path: Path) -> None:
    """Every 12-token completion fails alike (no reward signal) and the policy starts at the
    reference: the default skips the optimizer step; an entropy bonus is a signal of its own."""
    r = train_rl(base(tiny_model_dir, mats, tmp_path / "skip", steps=1, skip_no_signal_kl=1e-3))
    assert r["charts/update_skipped"] == 1.0 and r["charts/no_signal"] == 1.0 and "losses/policy_loss" not in r
    r = train_rl(base(tiny_model_dir, mats, tmp_path / "entropy", steps=1, skip_no_signal_kl=1e-3, entropy_coef=0.01))
    assert "charts/update_skipped" not in r and "losses/policy_loss" in r


def test_worth_a_step() -> None:
    """The skip rule: a step is taken with a reward signal, with an entropy bonus, or when the
    policy has drifted from the reference (the KL loss pulls it back); else Adam would scale the
    gradient's float noise up to a full step (the demo's policy moved by 1e-5 per weight with a
    gradient norm of 1e-5)."""
    from sparserl.harness.result import ErrorKind, EvalResult
    from sparserl.rl.rollout import RolloutBatch
    from sparserl.rl.trainer import _worth_a_step, batch_metrics

    def batch(scores: list[float], kl: float) -> RolloutBatch:
        B = len(scores)
        res = [EvalResult.failure("spmv", None, "m", ErrorKind.INCORRECT, "", compiled=True)] * B
        return RolloutBatch([None] * B, [""] * B, torch.zeros(B, 3, dtype=torch.long), torch.ones(B, 3),
                            torch.full((B, 3), kl), torch.zeros(B, 3), None, torch.tensor(scores), res)

    def worth(cfg: RLConfig, b: RolloutBatch) -> bool:  # as rl_step asks: on the batch's metrics
        return _worth_a_step(cfg, batch_metrics(b, cfg), "cpu")

    cfg = RLConfig(samples_per_matrix=2, skip_no_signal_kl=1e-3)
    assert not worth(cfg, batch([1.0, 1.0, -2.0, -2.0], 1e-6))  # equal within each group
    assert worth(cfg, batch([1.0, 1.0, -2.0, -1.0], 1e-6))  # one group differs
    assert worth(cfg, batch([1.0, 1.0], 0.01))  # drifted: the KL loss has work to do
    assert worth(dataclasses.replace(cfg, entropy_coef=0.01), batch([1.0, 1.0], 0.0))
    assert worth(dataclasses.replace(cfg, skip_no_signal_kl=None), batch([1.0, 1.0], 0.0))


@pytest.mark.parametrize("lora", [False, True])
def test_the_reference_is_read_at_the_sampling_temperature(lora: bool, tiny_tokenizer, tiny_hf_config) -> None:
    """At the start the policy is its reference, so at any sampling temperature (0.7 here) the annotated old and
    reference log-probs agree and the KL starts at 0. Mutation killed: the reference's log-probs taken at
    temperature 1 while sampling at another (a review found it survived; harmless only at T = 1)."""
    policy = tiny_policy(tiny_tokenizer, tiny_hf_config, lora=lora, dropout=0.0)
    batch = rollout(policy, None, tiny_samples(policy), torch.zeros(4), temperature=0.7, max_new_tokens=8)
    assert batch.mask.sum() > 0
    assert torch.allclose(batch.old_logp, batch.ref_logp, atol=1e-5), (batch.old_logp - batch.ref_logp).abs().max()
