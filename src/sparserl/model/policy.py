"""The policy: any Hugging Face causal LM, with the matrix encoding prepended as soft tokens.

Sequence layout (one sample; the batch is left-padded to a common length)::

    [matrix tokens (summary + coordinates)] [prompt text tokens] [completion tokens <eos>]

The matrix tokens come from :class:`sparserl.encoding.MatrixEncoder` and enter through
``inputs_embeds``; the prompt names the op (and, unless ``text_prompt=False``, the shape
and nonzero count) and, with ``card`` (the default for new models), carries the matrix card
(:meth:`sparserl.matrices.card.MatrixCard.prompt`: exact structure facts, no values) in plain
text. :func:`make_sample` is how every caller builds a sample, so the card is the same text in
SFT, RL rollouts, ``generate``, ``search`` and ``evaluate``. The loss is next-token
cross-entropy on the completion tokens only.
Generation uses a static KV cache and, on a GPU, one CUDA graph per decode step
(:mod:`sparserl.model.decode`), with temperature, top-k and top-p sampling, and stops at the
end-of-kernel token.

Fine-tuning is LoRA through PEFT (the base model frozen) or full. A checkpoint folder holds
the model (or only the adapters, with the base model's path), the tokenizer, the encoder's
weights (safetensors) and ``policy.json``; :meth:`Policy.load` restores all of it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from sparserl.encoding import EncodingConfig, MatrixEncoder, MatrixInput
from sparserl.errors import SparseRLError
from sparserl.kernels.contract import VALUES_RULE, Op
from sparserl.matrices.card import prompt_card
from sparserl.model import hf_parts
from sparserl.model.decode import decode
from sparserl.model.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters on the attention and MLP projections."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: tuple[str, ...] = LORA_TARGETS


@dataclass(frozen=True)
class PolicyConfig:
    """How the policy is built around a causal LM."""

    encoding: EncodingConfig = field(default_factory=EncodingConfig)
    text_prompt: bool = True
    """Name the shape and nonzero count in the prompt text (off: only the op)."""
    card: bool = True
    """Carry the matrix card in the prompt text (saved with the checkpoint; a checkpoint saved
    before this setting existed loads with it off, as it was trained)."""
    lora: LoraSpec | None = None
    """LoRA adapters (None: full fine-tuning)."""
    gradient_checkpointing: bool = False
    dtype: str = "float32"
    """Weights' dtype: float32 or bfloat16."""


@dataclass(frozen=True)
class Sample:
    """One policy input: a prepared matrix and the operation asked for."""

    matrix: MatrixInput
    op: Op
    k: int | None = None
    nnz: int = 0
    prompt: str | None = None
    """The whole text prompt, when a caller writes its own (a search's refinement prompt);
    None: the task line below."""
    card: str | None = None
    """The matrix card's prompt text (:func:`sparserl.matrices.card.prompt_card`), or None."""


def make_sample(A, config: PolicyConfig, op: Op, k: int | None = None, *, inp: MatrixInput | None = None,
                nnz: int | None = None, card: str | None = None) -> Sample:
    """The policy input for matrix ``A``: its encoder input (``inp``, else sampled now) and, when
    ``config.card``, its card (``card``, else :func:`~sparserl.matrices.card.prompt_card` of ``A``)."""
    on = uses_card(config)
    if on and card is None:
        card = prompt_card(A)
    return Sample(inp if inp is not None else MatrixInput.from_matrix(A, config.encoding), op,
                  k if op is Op.SPMM else None, int(A.nnz) if nnz is None else int(nnz), card=card if on else None)


def uses_card(config) -> bool:
    """Whether prompts for a policy of ``config`` carry the card (a stand-in config without the
    setting: no, like a checkpoint saved before it existed)."""
    return bool(getattr(config, "card", False))


def prompt_text(s: Sample, text_prompt: bool, card: bool = False) -> str:
    """The text after the matrix's soft tokens: a caller's own prompt (a search's refinement prompt),
    else the operation, and with ``text_prompt`` the shape and the contract's values rule
    (:data:`~sparserl.kernels.contract.VALUES_RULE`: a kernel may bake the structure in, never the
    values; docs/contract.md has every rule), and with ``card`` the sample's matrix card.

    Raises SparseRLError when ``card`` is asked for and the sample has none (build samples with
    :func:`make_sample`): a model trained with the card is never prompted without it."""
    if s.prompt is not None:
        return s.prompt
    what = "SpMV y = A x" if s.op is Op.SPMV else f"SpMM Y = A X with k = {s.k}"
    if card and not s.card:
        raise SparseRLError("this policy's prompt carries the matrix card, and the sample has none: "
                            "build samples with sparserl.model.policy.make_sample")
    card_lines = f"Matrix card:\n{s.card.strip()}\n" if card else ""
    if not text_prompt:
        return f"{what}\n{card_lines}"
    m, n = s.matrix.shape
    head = f"{what} for the {m} x {n} sparse matrix above ({s.nnz} nonzeros). {VALUES_RULE}"
    if not card:  # the prompt of the models trained before the card, unchanged
        return f"{head} Fastest correct kernel:\n"
    return f"{head}\n{card_lines}Fastest correct kernel:\n"


def _dtype(name: str) -> torch.dtype:
    if name not in ("float32", "bfloat16"):
        raise SparseRLError(f"dtype must be float32 or bfloat16, got {name!r}")
    return getattr(torch, name)


class Policy(torch.nn.Module):
    """A causal LM plus the matrix encoder; ``loss`` for SFT, ``generate`` for sampling."""

    def __init__(self, lm, tokenizer, config: PolicyConfig, base_path: str | None = None):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        self.base_path = base_path
        self._library_lengths: dict[str, int] | None = None  # library kernels in this tokenizer's tokens
        self._budgets_named: set[tuple[int, int]] = set()  # (requested, taught) whose cut was named once
        self.taught_tokens = 0
        """The longest completion this policy was fine-tuned on, in its tokens (0: none known): the automatic
        completion budget lets a sample finish it (:mod:`sparserl.model.budget`); saved in policy.json."""
        if config.lora is not None:
            from peft import LoraConfig, get_peft_model

            present = {n.split(".")[-1] for n, _ in lm.named_modules()}
            targets = [t for t in config.lora.targets if t in present]
            if not targets:
                raise SparseRLError(f"none of the LoRA targets {config.lora.targets} exist in this model")
            lm = get_peft_model(lm, LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha,
                                               lora_dropout=config.lora.dropout, target_modules=targets,
                                               task_type="CAUSAL_LM"))
        if config.gradient_checkpointing:
            if hasattr(lm, "activation_checkpointing_enable"):  # the name in newer transformers 5.x
                lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lm = lm
        hidden = self.base_model.config.hidden_size
        self.encoder = MatrixEncoder(hidden, config.encoding).to(self.embeddings.weight.device,
                                                                 dtype=self.embeddings.weight.dtype)

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, config: PolicyConfig | None = None, device: str = "cpu") -> "Policy":
        """Wrap the HF causal LM in local folder ``path`` (any architecture with input embeddings)."""
        from transformers import AutoModelForCausalLM

        config = config or PolicyConfig()
        path = Path(path)
        if not (path / "config.json").exists():
            raise SparseRLError(f"{path} is not a Hugging Face model folder (no config.json)")
        lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(config.dtype)).to(device)
        return cls(lm, load_tokenizer(path), config, base_path=str(path.resolve()))

    @classmethod
    def from_config(cls, hf_config, tokenizer, config: PolicyConfig | None = None, device: str = "cpu",
                    seed: int = 0) -> "Policy":
        """A randomly initialised model of any shape (tests, memory checks: no download)."""
        from transformers import AutoModelForCausalLM

        config = config or PolicyConfig()
        torch.manual_seed(seed)
        with torch.device(device):  # initialise on the target device (an 8B model takes minutes on a CPU)
            lm = AutoModelForCausalLM.from_config(hf_config, dtype=_dtype(config.dtype))
        return cls(lm, tokenizer, config)

    @classmethod
    def open(cls, path: str | Path, config: PolicyConfig | None = None, device: str = "cpu") -> "Policy":
        """A policy checkpoint (folder with policy.json) or, failing that, a HF model folder wrapped with ``config``."""
        path = Path(path)
        if (path / "policy.json").exists():
            return cls.load(path, device=device)
        if (path / "config.json").exists():
            return cls.from_pretrained(path, config, device=device)
        raise SparseRLError(f"no model at {path}: give a policy checkpoint (sparserl sft / ppo) or a Hugging Face "
                            "model folder (sparserl pretrain writes one)")

    @property
    def base_model(self):
        return hf_parts.base_model(self.lm)

    @property
    def embeddings(self):
        return self.base_model.get_input_embeddings()

    @property
    def device(self) -> torch.device:
        return self.embeddings.weight.device

    # -- inputs ----------------------------------------------------------------------------

    def _prefix(self, samples: list[Sample]):
        """Per sample: the embeddings of matrix tokens + prompt tokens, (L_i, d)."""
        mat = [self.encoder.encode_one(s.matrix) for s in samples]
        prompts = [self.tokenizer(prompt_text(s, self.config.text_prompt, self.config.card),
                                  add_special_tokens=False)["input_ids"]
                   for s in samples]
        emb = self.embeddings
        out = []
        for m, p in zip(mat, prompts):
            pe = emb(torch.tensor(p, dtype=torch.long, device=self.device))
            out.append(torch.cat([m.to(pe.dtype), pe], dim=0))
        return out

    def _batch(self, parts: list[torch.Tensor], labels: list[torch.Tensor] | None = None):
        """Left-pad (L_i, d) sequences into inputs_embeds, attention_mask, position_ids[, labels]."""
        T = max(p.shape[0] for p in parts)
        B, d = len(parts), parts[0].shape[1]
        embeds = parts[0].new_zeros(B, T, d)
        mask = torch.zeros(B, T, dtype=torch.long, device=self.device)
        lab = torch.full((B, T), -100, dtype=torch.long, device=self.device) if labels is not None else None
        for b, p in enumerate(parts):
            embeds[b, T - p.shape[0]:] = p
            mask[b, T - p.shape[0]:] = 1
            if lab is not None:
                lab[b, T - p.shape[0]:] = labels[b]
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return embeds, mask, pos, lab

    def completion_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    # -- training --------------------------------------------------------------------------

    def loss(self, samples: list[Sample], completions: list[str], reduction: str = "mean") -> torch.Tensor:
        """Next-token cross-entropy over the completion tokens (EOS included): their mean, or with
        ``reduction="sum"`` their sum (a micro-batch's share of a step, divided by the caller)."""
        if len(samples) != len(completions) or not samples:
            raise SparseRLError("loss() needs one completion per sample")
        if reduction not in ("mean", "sum"):
            raise SparseRLError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        prefix = self._prefix(samples)
        parts, labels = [], []
        emb = self.embeddings
        for pre, text in zip(prefix, completions):
            ids = torch.tensor(self.completion_ids(text), dtype=torch.long, device=self.device)
            parts.append(torch.cat([pre, emb(ids)], dim=0))
            # position t predicts token t+1: label the positions whose next token is a completion token
            lab = torch.full((pre.shape[0] + ids.shape[0],), -100, dtype=torch.long, device=self.device)
            lab[pre.shape[0] - 1: -1] = ids
            labels.append(lab)
        embeds, mask, pos, lab = self._batch(parts, labels)
        logits = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1),
                                                 ignore_index=-100, reduction=reduction)

    def sequence_lengths(self, samples: list[Sample], completions: list[str]) -> list[tuple[int, int]]:
        """Per row: (tokens of the whole sequence, completion tokens with EOS), what :meth:`loss` feeds
        and scores; the matrix tokens counted as the encoder makes them (summary tokens, then one per
        sampled coordinate), without running it."""
        out = []
        for s, text in zip(samples, completions):
            mat = self.encoder.num_summary_tokens + len(s.matrix.rows)
            prompt = len(self.tokenizer(prompt_text(s, self.config.text_prompt, self.config.card),
                                        add_special_tokens=False)["input_ids"])
            n = len(self.completion_ids(text))
            out.append((mat + prompt + n, n))
        return out

    def response_forward(self, samples: list[Sample], response_ids: torch.Tensor, response_mask: torch.Tensor,
                         hidden: bool = False):
        """Logits (B, T, V) predicting each response token, and optionally the hidden states
        (B, T, d) at the same positions (for a value head).

        response_ids, response_mask: (B, T), right-padded. The prefixes are left-padded, so
        every response ends at the same column and one slice serves the whole batch.
        """
        prefix = self._prefix(samples)
        emb = self.embeddings(response_ids.to(self.device))
        parts = [torch.cat([p, e.to(p.dtype)], dim=0) for p, e in zip(prefix, emb)]
        embeds, mask, _, _ = self._batch(parts)
        T = response_ids.shape[1]
        mask[:, -T:] = response_mask.to(mask.dtype)
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, output_hidden_states=hidden)
        L = embeds.shape[1]
        logits = out.logits[:, L - T - 1: L - 1]
        if not hidden:
            return logits, None
        return logits, out.hidden_states[-1][:, L - T - 1: L - 1]

    # -- sampling --------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, samples: list[Sample], max_new_tokens: int | None = None, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, engine: str | None = None,
                 header_grammar: bool = False) -> list[str]:
        """Sample one completion per sample (KV cache, stops at the end-of-kernel token)."""
        ids = self.generate_ids(samples, max_new_tokens, temperature, top_k, top_p, seed, engine,
                                header_grammar=header_grammar)
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    @torch.no_grad()
    def generate_ids(self, samples: list[Sample], max_new_tokens: int | None = None, temperature: float = 1.0,
                     top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                     engine: str | None = None, return_logp: bool = False, header_grammar: bool = False):
        """The generated token ids, (B, L) padded with the pad token after each sequence's end;
        with ``return_logp`` also the sampler's log-probabilities of those tokens, (B, L) float32.

        ``max_new_tokens``: see :meth:`completion_budget` (None: enough for every library kernel).
        ``engine``: see :mod:`sparserl.model.decode` (default: a CUDA graph per decode step on a
        GPU, the same loop eagerly on a CPU, ``generate()`` for models it cannot drive).
        ``header_grammar``: draw the header's tokens only where the header stays a prefix of the
        contract's grammar (:mod:`sparserl.model.header_grammar`; its log-probabilities are then the
        masked distribution's, so RL rollouts never ask for it)."""
        max_new_tokens = self.completion_budget(max_new_tokens)
        if seed is not None:
            torch.manual_seed(seed)
        was_training = self.training
        self.eval()
        embeds, mask, _, _ = self._batch(self._prefix(samples))
        constraint = None
        if header_grammar:
            from sparserl.model.header_grammar import HeaderGrammar

            head = self.lm.get_output_embeddings()
            width = head.weight.shape[0] if head is not None else None  # a padded vocabulary: the logits' width
            constraint = HeaderGrammar.for_tokenizer(self.tokenizer, width).constraint(len(samples), embeds.device)
        out = decode(self.lm, embeds, mask, max_new_tokens, eos_id=self.tokenizer.eos_token_id,
                     pad_id=self.tokenizer.pad_token_id, temperature=temperature, top_k=top_k, top_p=top_p,
                     engine=engine, return_logp=return_logp, constraint=constraint)
        if was_training:
            self.train()
        return out

    def completion_budget(self, requested: int | None) -> int:
        """The decoder's ``max_new_tokens`` for ``requested`` (None: the longest library kernel or taught
        completion in this policy's tokens, plus a margin; see :mod:`sparserl.model.budget`)."""
        from sparserl.model.budget import completion_budget, library_token_lengths

        if self._library_lengths is None:
            self._library_lengths = library_token_lengths(self.tokenizer)
        key = (requested or 0, self.taught_tokens)  # a cut is named once, not at every batch of a loop
        warn = key not in self._budgets_named
        self._budgets_named.add(key)
        return completion_budget(self.tokenizer, requested, self._library_lengths, self.taught_tokens, warn=warn)

    # -- checkpoints -----------------------------------------------------------------------

    def save(self, folder: str | Path) -> None:
        """Model (or LoRA adapters), tokenizer, encoder weights and policy.json."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(str(folder / "lm"))
        self.tokenizer.save_pretrained(str(folder / "lm"))
        save_file({k: v.contiguous() for k, v in self.encoder.state_dict().items()}, str(folder / "encoder.safetensors"))
        meta = {"config": asdict(self.config), "base_path": self.base_path, "lora": self.config.lora is not None,
                "taught_tokens": self.taught_tokens}
        (folder / "policy.json").write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> "Policy":
        """Restore a policy saved with :meth:`save`."""
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        folder = Path(folder)
        if not (folder / "policy.json").exists():
            raise SparseRLError(f"{folder} is not a policy checkpoint (no policy.json)")
        meta = json.loads((folder / "policy.json").read_text())
        c = meta["config"]
        config = PolicyConfig(encoding=EncodingConfig(**c["encoding"]), text_prompt=c["text_prompt"],
                              card=c.get("card", False),  # saved before the card existed: trained without it
                              lora=LoraSpec(**{**c["lora"], "targets": tuple(c["lora"]["targets"])}) if c["lora"] else None,
                              gradient_checkpointing=c["gradient_checkpointing"], dtype=c["dtype"])
        tok = load_tokenizer(folder / "lm")
        if meta["lora"]:
            from peft import PeftModel

            if not meta["base_path"] or not Path(meta["base_path"], "config.json").exists():
                raise SparseRLError(f"LoRA checkpoint {folder} needs its base model at {meta['base_path']}")
            base = AutoModelForCausalLM.from_pretrained(meta["base_path"], dtype=_dtype(config.dtype))
            lm = PeftModel.from_pretrained(base, str(folder / "lm"), is_trainable=True)
            policy = cls(lm, tok, PolicyConfig(**{**asdict(config), "lora": None,
                                                  "encoding": config.encoding}), base_path=meta["base_path"])
            policy.config = config
        else:
            lm = AutoModelForCausalLM.from_pretrained(str(folder / "lm"), dtype=_dtype(config.dtype))
            policy = cls(lm, tok, config, base_path=meta["base_path"])
        policy.encoder.load_state_dict(load_file(str(folder / "encoder.safetensors")))
        policy.taught_tokens = int(meta.get("taught_tokens", 0))  # saved before it existed: not known
        return policy.to(device)
