"""The policy wrapper on a tiny random model (CPU): loss, learning, generation, checkpoints, LoRA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparserl.encoding import EncodingConfig, MatrixInput  # noqa: E402
from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.kernels.library import variants  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from sparserl.matrices.card import prompt_card  # noqa: E402
from sparserl.model.policy import LoraSpec, Policy, PolicyConfig, Sample  # noqa: E402

ENC = EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2)


def samples():
    out = []
    for A, op, k in ((generate("banded", 300, seed=0, bands=3), Op.SPMV, None),
                     (generate("random", 200, seed=1, nnz_per_row=4), Op.SPMM, 8)):
        out.append(Sample(MatrixInput.from_matrix(A, ENC), op, k, int(A.nnz), card=prompt_card(A)))
    return out


TARGETS = [variants("spmv", "DIA")[0].render()[:400], variants("spmm", "CSR")[0].render()[:400]]


def train_steps(policy: Policy, steps: int, lr: float = 3e-3) -> list[float]:
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        loss = policy.loss(samples(), TARGETS)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_full_finetune_learns_and_changes_parameters(tiny_tokenizer, tiny_hf_config) -> None:
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    before = {n: t.detach().clone() for n, t in p.named_parameters()}
    losses = train_steps(p, 25)
    assert losses[-1] < 0.6 * losses[0], losses
    changed = [n for n, t in p.named_parameters() if not torch.equal(t, before[n])]
    assert any(n.startswith("encoder.") for n in changed) and any(n.startswith("lm.") for n in changed)


def test_loss_only_counts_completion_tokens(tiny_tokenizer, tiny_hf_config) -> None:
    """Changing the prompt wording changes the inputs but the loss stays a completion-only mean."""
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    l1 = p.loss(samples()[:1], TARGETS[:1]).item()
    p2 = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC, text_prompt=False))
    l2 = p2.loss(samples()[:1], TARGETS[:1]).item()
    import math

    vocab = len(tiny_tokenizer)
    assert abs(l1 - math.log(vocab)) < 1.5 and abs(l2 - math.log(vocab)) < 1.5  # ~uniform at init


def test_generation_is_batched_seeded_and_stops(tiny_tokenizer, tiny_hf_config) -> None:
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    a = p.generate(samples(), max_new_tokens=12, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    b = p.generate(samples(), max_new_tokens=12, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    c = p.generate(samples(), max_new_tokens=12, temperature=1.0, seed=8)
    assert a == b and len(a) == 2 and all(isinstance(t, str) for t in a) and a != c
    # after learning the targets, greedy decoding reproduces the start of them and stops
    train_steps(p, 60)
    greedy = p.generate(samples()[:1], max_new_tokens=40, temperature=0)
    assert greedy[0].startswith("FORMAT: DIA"), greedy[0][:60]


def test_checkpoint_round_trip(tmp_path, tiny_tokenizer, tiny_hf_config) -> None:
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    train_steps(p, 3)
    p.save(tmp_path / "ckpt")
    q = Policy.load(tmp_path / "ckpt")
    with torch.no_grad():
        assert p.loss(samples(), TARGETS).item() == pytest.approx(q.loss(samples(), TARGETS).item(), rel=1e-5)
    assert p.generate(samples(), max_new_tokens=10, seed=3) == q.generate(samples(), max_new_tokens=10, seed=3)


def test_lora_trains_adapters_and_encoder_only(tmp_path, tiny_tokenizer, tiny_hf_config) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_hf_config)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer.save_pretrained(tmp_path / "base")
    p = Policy.from_pretrained(tmp_path / "base", PolicyConfig(encoding=ENC, lora=LoraSpec(r=8, alpha=16, dropout=0.0)))
    trainable = [n for n, t in p.named_parameters() if t.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("encoder.") for n in trainable)
    frozen = {n: t.detach().clone() for n, t in p.named_parameters() if not t.requires_grad}
    losses = train_steps(p, 25, lr=1e-2)
    assert losses[-1] < losses[0]
    assert all(torch.equal(t, frozen[n]) for n, t in p.named_parameters() if n in frozen)
    p.save(tmp_path / "lora_ckpt")
    assert not (tmp_path / "lora_ckpt" / "lm" / "model.safetensors").exists(), "adapters only"
    q = Policy.load(tmp_path / "lora_ckpt")
    with torch.no_grad():
        assert p.loss(samples(), TARGETS).item() == pytest.approx(q.loss(samples(), TARGETS).item(), rel=1e-5)


def test_gradient_checkpointing_gives_the_same_loss(tiny_tokenizer, tiny_hf_config) -> None:
    a = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC), seed=1)
    b = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC, gradient_checkpointing=True),
                           seed=1)
    b.encoder.load_state_dict(a.encoder.state_dict())
    m = b.base_model
    assert getattr(m, "is_activation_checkpointing", False) or m.is_gradient_checkpointing
    la, lb = a.loss(samples(), TARGETS), b.loss(samples(), TARGETS)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-5)


def test_bad_paths(tmp_path) -> None:
    with pytest.raises(SparseRLError, match="not a Hugging Face model folder"):
        Policy.from_pretrained(tmp_path)
    with pytest.raises(SparseRLError, match="not a policy checkpoint"):
        Policy.load(tmp_path)


def test_response_forward_matches_the_sft_loss(tiny_tokenizer, tiny_hf_config) -> None:
    """Log-probs of given responses from response_forward equal the per-token SFT loss."""
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    ids = [torch.tensor(p.completion_ids(t)) for t in TARGETS]
    T = max(len(i) for i in ids)
    resp = torch.full((2, T), tiny_tokenizer.pad_token_id)
    mask = torch.zeros(2, T)
    for b, i in enumerate(ids):
        resp[b, : len(i)] = i
        mask[b, : len(i)] = 1
    logits, hid = p.response_forward(samples(), resp, mask, hidden=True)
    assert logits.shape[:2] == (2, T) and hid.shape == (2, T, tiny_hf_config.hidden_size)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, resp[..., None]).squeeze(-1)
    nll = -(logp * mask).sum() / mask.sum()
    assert float(nll) == pytest.approx(float(p.loss(samples(), TARGETS)), rel=1e-4)
