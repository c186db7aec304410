"""The training stages' settings: :class:`PretrainConfig` (stage 1) and :class:`SFTConfig` (stage 2).

Plain dataclasses with no torch behind them, so the command line reads its defaults from them
without loading a model library."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sparserl.checks import check_device, require
from sparserl.data.corpus import CorpusConfig
from sparserl.errors import SparseRLError
from sparserl.model.config import POLICY_TEMPERATURE, TinyModelConfig, preset_shape


def check_language_model(model: str) -> None:
    """``pretrain --model``: a local Hugging Face causal LM folder (config.json and a tokenizer), said in one
    line before any work when it is not (a policy checkpoint: its ``lm/`` folder is one)."""
    m = Path(model)
    if (m / "policy.json").exists():
        raise SparseRLError(f"--model {m}: a policy checkpoint; pre-training continues a language model: give its "
                            f"lm/ folder ({m / 'lm'})")
    if not m.is_dir():
        raise SparseRLError(f"--model {m}: no such folder (give a local Hugging Face model folder; without --model "
                            "the default model is trained from scratch)")
    if not (m / "config.json").exists():
        raise SparseRLError(f"--model {m}: not a Hugging Face model folder (no config.json)")
    if not any((m / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        raise SparseRLError(f"--model {m}: no tokenizer in the folder (tokenizer.json or tokenizer_config.json)")


@dataclass(frozen=True)
class PretrainConfig:
    """Stage-1 pre-training."""

    out: str = "runs/pretrain"
    """Output folder (model/, state.pt, metrics.jsonl)."""
    model: str | None = None
    """A local HF causal LM to continue pre-training; None trains the default model from scratch."""
    vocab_size: int = 8192
    """BPE vocabulary of the tokenizer trained from scratch."""
    shape: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the model trained from scratch (``preset`` replaces it when given)."""
    preset: str | None = None
    """A named shape for the model trained from scratch: 'default' (about 29M) or 'base' (about 210M)."""
    corpus_dir: str | None = None
    """A built corpus (``sparserl corpus build``) or its pack (``sparserl corpus pack``); None: the
    toolkit headers and kernel library found on this machine (``corpus``)."""
    minutes: float | None = None
    """Wall-clock budget: training stops after this many minutes (checkpoint and evaluation follow);
    the learning rate decays over whichever ends first, the budget or ``steps``."""
    seq_len: int = 512
    """Tokens per training sequence."""
    batch_size: int = 32
    """Sequences per optimizer step."""
    steps: int = 2000
    """Optimizer steps."""
    lr: float = 1e-3
    """Peak learning rate (AdamW), after linear warm-up, cosine decay to 10%."""
    warmup_steps: int = 100
    """Steps of linear warm-up."""
    weight_decay: float = 0.1
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    eval_every: int = 500
    """Steps between held-out perplexity evaluations."""
    save_every: int = 500
    """Steps between checkpoints."""
    heldout_tokens: int = 200_000
    """Held-out tokens scored for perplexity (at most, per held-out package)."""
    device: str = "auto"
    """'auto' (cuda if available), 'cuda', 'cpu'."""
    bf16: bool = True
    """bf16 autocast on CUDA."""
    compile: bool = False
    """torch.compile the model for training (CUDA only; the first steps pay the compile time)."""
    peak_tflops: float | None = None
    """Peak dense bf16 TFLOP/s for MFU; None: from the GPU's name (H200: 989), no MFU on a CPU."""
    seed: int = 0
    """Seed of the initial weights and the batches."""
    resume: bool = False
    """Continue from ``out/state.pt`` if present."""
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    """What goes into the corpus (CUDA toolkit headers, the kernel library) and how much."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "--steps", ">= 1", self.steps)
        require(self.batch_size >= 1, "--batch-size", ">= 1", self.batch_size)
        require(self.seq_len >= 8, "--seq-len", ">= 8 tokens", self.seq_len)
        require(self.lr > 0, "--lr", "> 0", self.lr)
        require(self.vocab_size >= 256, "--vocab-size", ">= 256", self.vocab_size)
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
        require(self.warmup_steps >= 0, "--warmup-steps", ">= 0", self.warmup_steps)
        require(self.eval_every >= 1, "--eval-every", ">= 1 (steps between evaluations)", self.eval_every)
        require(self.save_every >= 1, "--save-every", ">= 1 (steps between checkpoints)", self.save_every)
        require(self.heldout_tokens >= 1, "--heldout-tokens", ">= 1", self.heldout_tokens)
        require(self.weight_decay >= 0, "--weight-decay", ">= 0", self.weight_decay)
        require(self.grad_clip > 0, "--grad-clip", "> 0", self.grad_clip)
        check_device(self.device)
        if self.model is not None:
            check_language_model(self.model)
        if self.preset is not None:
            preset_shape(self.preset)
        if self.minutes is not None and self.minutes <= 0:
            raise SparseRLError("--minutes must be positive")
        if self.corpus_dir and not Path(self.corpus_dir).is_dir():
            raise SparseRLError(f"--corpus {self.corpus_dir}: no such folder")

    @property
    def model_shape(self) -> TinyModelConfig:
        """The shape a model trained from scratch gets."""
        return preset_shape(self.preset) if self.preset else self.shape


@dataclass(frozen=True)
class SFTConfig:
    """Stage-2 supervised fine-tuning."""

    data: str = "runs/data"
    """A folder with train.jsonl (and val.jsonl), or one .jsonl file (then 10% is held out for val)."""
    model: str = "runs/pretrain/model"
    """A local HF causal LM folder, or a policy checkpoint (folder with policy.json)."""
    out: str = "runs/sft"
    """Output folder (checkpoint/, state.pt, metrics.jsonl, result.json)."""
    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 8
    """(matrix, kernel) pairs per step."""
    lr: float = 3e-4
    """Peak learning rate (AdamW), after linear warm-up, cosine decay to 10%."""
    warmup_steps: int = 50
    """Steps of linear warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    lora: bool = False
    """LoRA adapters on a frozen base (True for large models), else full fine-tuning."""
    lora_r: int = 16
    """LoRA rank (alpha = 2 r)."""
    max_nnz: int = 128
    """Coordinate tokens per matrix."""
    text_prompt: bool = True
    """Name the shape and nonzero count in the prompt text (besides the matrix soft tokens)."""
    card: bool | None = None
    """Carry the matrix card in the prompt. None: a new model gets it, a policy checkpoint keeps its
    own setting; True/False: set it (a checkpoint trained otherwise is re-trained to the new prompt)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more time)."""
    max_batch_tokens: int | None = 32768
    """Most padded tokens in one forward pass: a step's rows are split into micro-batches under it and
    their gradients summed (the step's loss unchanged). None: the whole batch at once."""
    eval_every: int = 250
    """Steps between validations (and one at the end)."""
    eval_samples: int = 32
    """Validation rows sampled and checked by the harness at each evaluation."""
    eval_temperature: float = POLICY_TEMPERATURE
    """Sampling temperature of the validation (> 0; by default the one the policy is served at,
    :data:`sparserl.model.config.POLICY_TEMPERATURE`)."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens (None: the longest library kernel in the policy's tokens plus a margin,
    :mod:`sparserl.model.budget`)."""
    save_every: int = 250
    """Steps between checkpoints (and one at the end)."""
    snapshots: tuple[int, ...] = ()
    """Steps after which the policy is also kept as ``out/checkpoint-stepN`` (the policy only; written when
    the step is reached, and again, the same, if a resume replays it), so that a shorter SFT can be evaluated
    beside the full one from the same run: the same base, batches and learning-rate schedule up to that step
    (the schedule decays over ``steps``, so a snapshot is not a run of N steps, whose rate would have decayed
    by then)."""
    resume: bool = False
    """Continue from ``out/state.pt`` when it is there."""
    device: str = "auto"
    """'auto' (cuda when available), 'cpu' or 'cuda[:N]'."""
    bf16: bool = True
    """bf16 autocast on CUDA."""
    compile_only: bool = False
    """Evaluate by compiling only (no GPU)."""
    seed: int = 0
    """Seed of the batches, the encoding's sampling, a new encoder's weights and the validation draw."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "--steps", ">= 1", self.steps)
        require(self.batch_size >= 1, "--batch-size", ">= 1", self.batch_size)
        require(self.lr > 0, "--lr", "> 0", self.lr)
        require(self.lora_r >= 1, "--lora-r", ">= 1", self.lora_r)
        require(self.max_batch_tokens is None or self.max_batch_tokens >= 1, "--max-batch-tokens", ">= 1",
                self.max_batch_tokens)
        require(self.max_nnz >= 1, "--max-nnz", ">= 1", self.max_nnz)
        require(self.eval_every >= 1, "--eval-every", ">= 1", self.eval_every)
        require(self.eval_samples >= 0, "--eval-samples", ">= 0", self.eval_samples)
        require(self.save_every >= 1, "--save-every", ">= 1", self.save_every)
        require(self.warmup_steps >= 0, "--warmup-steps", ">= 0", self.warmup_steps)
        check_device(self.device)
        for n in self.snapshots:
            require(1 <= n < self.steps, "--snapshot", f"between 1 and --steps - 1 ({self.steps - 1})", n)
        require(self.max_new_tokens is None or self.max_new_tokens >= 1, "--max-new-tokens", ">= 1",
                self.max_new_tokens)
        require(self.eval_temperature > 0, "--eval-temperature", "> 0 (1.0: the policy as trained)",
                self.eval_temperature)
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
