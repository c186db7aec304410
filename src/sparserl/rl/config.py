"""The RL run's settings: one dataclass, a docstring under each field, invalid combinations
rejected with a message that says what to do; and loading them from TOML or YAML."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from sparserl.checks import check_device, check_setting_types, require
from sparserl.errors import SparseRLError
from sparserl.rewards import RewardConfig

KL_LOSSES = ("k2", "k3")
GRPO_BASELINES = ("mean_std", "loo")


@dataclass(frozen=True)
class RLConfig:
    """PPO / GRPO on the policy; one field per knob, a docstring under each."""

    # -- what and where ------------------------------------------------------------------
    algo: str = "ppo"
    """'ppo' (clipped update on leave-one-out advantages, or a critic with GAE) or 'grpo' (group-normalised
    advantages, no critic)."""
    model: str = "runs/sft/checkpoint"
    """Policy checkpoint (from sparserl sft) or a HF model folder."""
    matrices: str = "runs/data"
    """SFT data folder (its train split's matrices) or a folder of .mtx/.mtx.gz/.npz files."""
    val_matrices: str | None = None
    """Held-out matrices for the learning curve (default: the data folder's val split)."""
    out: str = "runs/ppo"
    """Output folder: checkpoint, state.pt, metrics.jsonl, TensorBoard, learning curve."""
    max_nnz: int = 128
    """Coordinate tokens per matrix when ``model`` is a plain HF folder (a checkpoint keeps its own)."""
    large_per_family: int | None = None
    """Large generated matrices (``large_rows`` rows) per generator family added to the training pool.
    The SFT data's matrices have 5k-100k rows, so DRAM-bound behaviour (1M rows, where PPO lost
    speed) never gave a training signal. None: 1 per family on GPU runs, 0 in compile-only runs
    (whose reward does not read the matrix)."""
    large_rows: int = 1_000_000
    """Rows of those large matrices."""
    # -- the rollout -----------------------------------------------------------------------
    steps: int = 200
    """RL steps (one rollout batch and its updates each)."""
    matrices_per_step: int = 8
    """Matrices per rollout batch."""
    samples_per_matrix: int = 4
    """Completions per matrix per step (the group of the group baselines)."""
    ops: tuple[str, ...] = ("spmv",)
    """Operations to train on ('spmv', 'spmm')."""
    k: int = 32
    """SpMM columns (when 'spmm' is in ops)."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens (None: the longest library kernel in the policy's tokens plus a margin,
    :mod:`sparserl.model.budget`)."""
    temperature: float = 1.0
    """Sampling temperature; the learner scores tokens at the same temperature (log-probs of
    softmax(logits / T)), so that the sampler's and the learner's log-probs agree."""
    # -- the update ------------------------------------------------------------------------
    lr: float = 1e-5
    """Policy learning rate (after warm-up)."""
    warmup_steps: int = 10
    """RL steps of linear learning-rate warm-up (policy and critic), from lr / warmup_steps."""
    epochs: int = 2
    """Passes over each rollout batch (fewer when ``target_kl`` stops them)."""
    minibatch: int = 8
    """Completions per minibatch."""
    clip: float = 0.2
    """PPO ratio clip."""
    target_kl: float | None = 0.02
    """Stop the update epochs of a step as soon as a minibatch's approximate KL to the rollout
    policy, mean over all its response tokens of 0.5 (log p - log p_old)^2, exceeds this (the
    minibatch is not applied). None: always run every epoch."""
    grad_clip: float = 1.0
    """Norm clip of the policy's gradient (the critic has its own)."""
    pg_token_share: float = 1.0
    """Share of each completion's response tokens that get the policy-gradient loss: those where the
    sampling policy's entropy was highest ("forking" tokens, Wang et al. 2025), chosen within each
    sequence; 1.0 (the default) is the textbook loss on every token. The KL loss (``kl_loss_coef``)
    covers every token either way. Chosen on the CPU toy (``benchmarks/rl_toy.py``, 3 seeds, PPO and
    GRPO, lr 2e-4 and 1e-3; benchmarks/results/2026-12-04/pg-token-share): every token kept more
    kernels intact than 0.05 in 11 of 12 pairs, both collapsed in the twelfth (0.79-0.81 against
    0.68-0.73 at lr 2e-4), and at 1e-3 0.05 collapsed in 3 of 6 runs, 1.0 in 1. The earlier default,
    0.05, came from H200 runs of 2026-11-30 that were not a controlled comparison (lambda differed,
    before the KL loss)."""
    kl_loss_coef: float = 0.05
    """Weight of the KL to the reference as a loss on every response token (PPO and GRPO), summed over
    tokens and divided by a fixed count. Without it, with ``pg_token_share`` 0.05, 95% of the tokens
    had no loss at all and an lr 5e-5 run drifted to 2.6 nats per token before it garbled its kernels."""
    kl_loss: str = "k2"
    """KL estimator of that loss: 'k2' (0.5 log-ratio^2, gradient = the log-ratio) or 'k3' with the
    log-ratio clamped (unclamped, k3's gradient grows exponentially where the policy has left the
    reference)."""
    kl_target: float | None = None
    """Adapt ``kl_loss_coef`` to keep the KL to the reference near this (None: fixed)."""
    kl_coef: float = 0.0
    """PPO: weight of a per-token KL penalty in the reward as well (the InstructGPT form), through
    GAE. 0 by default: with lambda = 1 it sums hundreds of noisy per-token terms into every return
    (a value loss of 7.5e3 was seen); the KL loss does the job. GRPO has no KL in the reward."""
    kl_estimator: str = "k1"
    """Per-token KL estimator of that reward penalty (k1, k2, k3, abs)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus on every response token (keeps exploration; 0 = off)."""
    skip_no_signal_kl: float | None = 1e-3
    """Skip the optimizer step when no reward signal reaches the policy (every group's rewards are
    equal on every rank, no entropy bonus) and the policy is within this KL per token of the
    reference: Adam would turn the float noise of such a step's gradient into a full-size step.
    None: always step."""
    kl_cov_share: float = 0.0
    """KL-Cov (Cui et al. 2025): share of the batch's tokens with the highest covariance of log-prob
    and advantage that get a ``kl_cov_coef * |log p - log p_old|`` penalty (the paper: 0.002;
    0 = off). Keeps the policy's entropy from collapsing through those few tokens."""
    kl_cov_coef: float = 1.0
    """Weight of the KL-Cov penalty."""
    # -- advantages ------------------------------------------------------------------------
    critic: bool = False
    """PPO: True trains a value head (on the policy's detached hidden states) and uses GAE; False (default):
    no critic, every token gets its completion's leave-one-out advantage (RLOO with PPO's clipped
    update). The critic's explained variance stayed at 0 in every H200 run, and where every reward of a
    step is equal its errors alone become the advantages: on benchmarks/rl_toy.py (lr 2e-3, 8 steps, all
    guards on) PPO drifted to 1.9 nats per token from the reference with the critic, 0.2 without."""
    vf_lr: float = 1e-3
    """Critic's learning rate (its own optimizer group; the policy's lr is far too small for a freshly
    initialised linear head: explained variance stayed at 0)."""
    vf_clip: float | None = 0.2
    """Value clipping, relative: a value moves at most ``vf_clip`` times the batch's return std from its
    rollout value (None: no clipping). Returns are in reward units, several per ladder rung."""
    vf_grad_clip: float = 1.0
    """Norm clip of the critic's gradient, separate from the policy's (one clip over both let a value
    loss of 7.5e3 shrink the policy's gradient about 700x)."""
    gamma: float = 1.0
    """Discount of GAE."""
    lam: float = 1.0
    """GAE's lambda. 1.0: the score on the last token reaches the first tokens, where the format
    and parameters are chosen, undiminished (less the critic's value). With 0.95 and ~670-token
    kernels an untrained critic left the choice tokens 0.95^600 ~ 1e-13 of it, and all of PPO's
    push landed on the last tokens of the code (the 2026-11-30 H200 runs garbled kernel endings)."""
    score_baseline: str = "group"
    """PPO: 'group' subtracts from each score the mean score of the other samples of the same
    matrix (leave-one-out) before GAE or as the advantage, so "this matrix is hard" does not read
    as "this kernel is bad"; 'none' is the textbook score (needs the critic)."""
    grpo_baseline: str = "mean_std"
    """GRPO: 'mean_std' (score minus the group mean, over the group std: the GRPO paper) or 'loo'
    (minus the mean of the *other* samples, unscaled: RLOO; a sample in its own baseline biases it)."""
    best_of_k: int = 1
    """Group objective: 1 = the mean reward; k > 1 = max@k, the expected best of k samples (an unbiased
    estimator over the group with a leave-one-out baseline; k = 1 is exactly the leave-one-out
    baseline). Rewards the best of a group rather than its mean. Needs a leave-one-out baseline (PPO
    score_baseline 'group', GRPO grpo_baseline 'loo') and k <= samples_per_matrix."""
    whiten_advantages: bool = True
    """Scale advantages by their batch std (PPO, and GRPO's 'loo'), never below ``adv_std_floor``; after a
    group baseline they are not re-centred, so no advantage changes sign (PPO with score_baseline 'none'
    is also centred on the batch mean)."""
    adv_std_floor: float = 0.1
    """Whitening and GRPO's group std divide by max(std, this): a batch or group whose rewards differ
    by less (timing jitter is ~0.03 in log2 speed) is not blown up to unit std."""
    # -- reward and harness ----------------------------------------------------------------
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward function and its coefficients."""
    regime: str = "cold"
    """Harness timing regime the reward uses."""
    turns: int = 1
    """Completions per sample in a row: turn t + 1 is shown turn t's kernel and its measured time
    or error and writes another (rl/turns.py); 1 = no refinement turns."""
    turn_discount: float = 0.5
    """With ``turns`` > 1, a completion's score is its reward plus this times its refinement's score."""
    store: str | None = None
    """Best-known store (``sparserl search``'s SQLite file) the relative_best reward reads and
    writes new bests to (None: the search's default, under the harness cache root). Unused by
    the other rewards."""
    # -- bookkeeping -----------------------------------------------------------------------
    eval_every: int = 20
    """Held-out evaluation every this many steps."""
    eval_samples_per_matrix: int = 1
    """Held-out completions per matrix."""
    save_every: int = 20
    """Checkpoint every this many steps."""
    resume: bool = False
    """Continue from ``out``'s checkpoint and state.pt."""
    compile_only: bool = False
    """No GPU: rewards from compile + static checks only (CPU smoke runs)."""
    device: str = "auto"
    """auto, cpu or cuda[:N]."""
    bf16: bool = False
    """Run the learner's forwards (old and reference log-probs, the update) under bf16 autocast on a
    GPU. Off by default: the sampler cannot autocast (its static KV cache holds one dtype), so with
    autocast on the learner scores tokens in a different precision from the one they were drawn in
    (``rollout/logp_gap`` shows how far). For bf16 throughout, give the model bf16 weights."""
    seed: int = 0
    """Seed of the matrix order, sampling and minibatch order."""

    def __post_init__(self) -> None:
        self._check_basics()
        self._check_advantages()
        self._check_kl()

    def _check_basics(self) -> None:
        check_device(self.device)
        if self.algo not in ("ppo", "grpo"):
            raise SparseRLError(f"algo must be ppo or grpo, got {self.algo!r}")
        if self.algo == "grpo" and self.samples_per_matrix < 2:
            raise SparseRLError("GRPO needs samples_per_matrix >= 2 (the group)")
        for name in ("steps", "matrices_per_step", "samples_per_matrix", "max_new_tokens"):  # flags too
            value = getattr(self, name)
            require(value is None or value >= 1, f"--{name.replace('_', '-')} ({name})", ">= 1", value)
        if min(self.epochs, self.minibatch) < 1:
            raise SparseRLError("epochs and minibatch must be >= 1")
        require(0 < self.pg_token_share <= 1, "--pg-token-share (pg_token_share)", "in (0, 1]", self.pg_token_share)
        require(self.lr > 0, "--lr (lr)", "> 0", self.lr)
        if self.vf_lr <= 0 or not 0 < self.clip < 1:
            raise SparseRLError("need vf_lr > 0 and 0 < clip < 1")
        require(self.temperature > 0, "--temperature (temperature)", "> 0", self.temperature)
        require(self.seed >= 0, "seed", ">= 0", self.seed)
        if self.warmup_steps < 0 or self.eval_every < 1 or self.save_every < 1:
            raise SparseRLError("warmup_steps must be >= 0, eval_every and save_every >= 1")
        if self.large_per_family is not None and self.large_per_family < 0 or self.large_rows < 1:
            raise SparseRLError("large_per_family must be >= 0 (or None: auto) and large_rows >= 1")
        if self.grad_clip <= 0 or self.vf_grad_clip <= 0:
            raise SparseRLError("grad_clip and vf_grad_clip must be > 0")

    def _check_advantages(self) -> None:
        if self.score_baseline not in ("group", "none"):
            raise SparseRLError(f"score_baseline must be group or none, got {self.score_baseline!r}")
        if self.turns < 1 or not 0.0 <= self.turn_discount <= 1.0:
            raise SparseRLError(f"turns must be >= 1 and turn_discount in [0, 1], got {self.turns}, "
                                f"{self.turn_discount}")
        if self.grpo_baseline not in GRPO_BASELINES:
            raise SparseRLError(f"grpo_baseline must be one of {', '.join(GRPO_BASELINES)}, got {self.grpo_baseline!r}")
        if self.algo == "ppo" and not self.critic and self.score_baseline != "group":
            raise SparseRLError("PPO without a critic needs score_baseline = 'group' (the leave-one-out baseline)")
        if not 1 <= self.best_of_k <= self.samples_per_matrix:
            raise SparseRLError(f"best_of_k must be in [1, samples_per_matrix = {self.samples_per_matrix}]")
        loo = self.score_baseline == "group" if self.algo == "ppo" else self.grpo_baseline == "loo"
        if self.best_of_k > 1 and not loo:
            raise SparseRLError("best_of_k > 1 needs a leave-one-out baseline: score_baseline = 'group' (PPO) "
                                "or grpo_baseline = 'loo' (GRPO)")
        if self.adv_std_floor < 0 or (self.vf_clip is not None and self.vf_clip <= 0):
            raise SparseRLError("adv_std_floor must be >= 0 and vf_clip > 0 (or None)")

    def _check_kl(self) -> None:
        if self.kl_loss not in KL_LOSSES:
            raise SparseRLError(f"kl_loss must be one of {', '.join(KL_LOSSES)}, got {self.kl_loss!r}")
        if min(self.kl_loss_coef, self.kl_coef, self.entropy_coef, self.kl_cov_coef) < 0:
            raise SparseRLError("kl_loss_coef, kl_coef, entropy_coef and kl_cov_coef must be >= 0")
        if self.algo == "grpo" and self.kl_coef > 0:
            raise SparseRLError("GRPO has no KL in the reward: set kl_loss_coef (the KL loss) instead of kl_coef")
        if not 0 <= self.kl_cov_share <= 1:
            raise SparseRLError(f"kl_cov_share must be in [0, 1], got {self.kl_cov_share}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise SparseRLError("target_kl must be > 0 (or None: no early stop)")
        if self.kl_target is not None and (self.kl_target <= 0 or self.kl_loss_coef == 0):
            raise SparseRLError("kl_target needs kl_target > 0 and a kl_loss_coef > 0 to adapt")

    @property
    def uses_critic(self) -> bool:
        """Whether this run trains a value head."""
        return self.algo == "ppo" and self.critic


def load_config_file(path: str | Path, **overrides) -> RLConfig:
    """RLConfig from a TOML or YAML file (keys = field names), then ``overrides``."""
    p = Path(path)
    if not p.exists():
        raise SparseRLError(f"{p}: no such config file")
    if p.suffix not in (".toml", ".yaml", ".yml"):
        raise SparseRLError(f"{p}: config files are .toml or .yaml")
    if not p.is_file():
        raise SparseRLError(f"{p}: not a file")
    try:
        if p.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(p.read_text())
        else:
            import yaml

            raw = yaml.safe_load(p.read_text()) or {}
    except UnicodeDecodeError as e:
        raise SparseRLError(f"{p}: not a text file ({e.reason})") from None
    except ValueError as e:  # tomllib.TOMLDecodeError
        raise SparseRLError(f"{p}: not valid TOML: {e}") from None
    except Exception as e:  # yaml.YAMLError, whose module may be absent until here
        if type(e).__module__.split(".")[0] != "yaml":
            raise
        raise SparseRLError(f"{p}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict):
        raise SparseRLError(f"{p}: a config file holds settings by name (key = value), got a {type(raw).__name__}")
    known = {f.name for f in fields(RLConfig)}
    bad = set(raw) - known
    if bad:
        raise SparseRLError(f"{p}: unknown settings {sorted(bad)}")
    check_setting_types(raw, RLConfig, str(p))
    if "reward" in raw:
        if not isinstance(raw["reward"], dict):
            raise SparseRLError(f"{p}: reward must be a table of settings, got {raw['reward']!r}")
        unknown = set(raw["reward"]) - {f.name for f in fields(RewardConfig)}
        if unknown:
            raise SparseRLError(f"{p}: unknown reward settings {sorted(unknown)}")
        check_setting_types(raw["reward"], RewardConfig, f"{p} [reward]")
        raw["reward"] = RewardConfig(**raw["reward"])
    if "ops" in raw:
        raw["ops"] = tuple(raw["ops"])
    return RLConfig(**(raw | overrides))
