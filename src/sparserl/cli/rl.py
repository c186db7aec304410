"""``sparserl ppo`` and ``sparserl grpo``: stage 3.

Their options default to "not given": the settings come from :class:`~sparserl.rl.config.RLConfig`'s
defaults, then the config file (``--config``), then the flags given. The help prints RLConfig's
value beside each option (:class:`RLCommand`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from typer.core import TyperCommand

from sparserl.cli.common import defaults, fallback
from sparserl.rewards import RewardConfig
from sparserl.rl.config import RLConfig, load_config_file
from sparserl.runs import check_output


def rl_config(algo: str, config: Path | None, given: dict) -> RLConfig:
    """RLConfig from the defaults, then the config file (if any), then the flags given (None = not given)."""
    over = {k: v for k, v in given.items() if v is not None} | {"algo": algo}
    if config:  # the file's settings, then the flags given; its out (if any) beats the default
        cfg = load_config_file(config, **over)
        if "out" not in over and cfg.out == RLConfig.out:
            cfg = dataclasses.replace(cfg, out=f"runs/{algo}")
    else:
        cfg = RLConfig(**({"out": f"runs/{algo}"} | over))
    return cfg


class RLCommand(TyperCommand):
    """``ppo`` / ``grpo``: the help prints RLConfig's default beside each option given as "not given"."""

    def format_help(self, ctx, formatter):
        shown = vars(defaults(RLConfig)) | {"reward": RewardConfig().name, "out": f"runs/{ctx.info_name}"}
        for p in self.params:
            if p.name in shown and p.default is None and "[default:" not in (p.help or ""):
                if not isinstance(shown[p.name], bool):  # an on/off flag is off unless given
                    p.help = f"{p.help or ''} \\[default: {shown[p.name]}]".strip()
        return super().format_help(ctx, formatter)


def _rl(algo: str):
    def cmd(
        config: Path = typer.Option(None, help="TOML or YAML file of RLConfig settings (flags below override it) "
                                               "[default: none]"),
        model: Path = typer.Option(None, help="policy checkpoint (sparserl sft) or HF model folder"),
        matrices: Path = typer.Option(None, help="SFT data folder (train split) or a folder of matrices"),
        out: Path = typer.Option(None, help="output folder"),
        steps: int = typer.Option(None, help="RL steps"),
        matrices_per_step: int = typer.Option(None, help="matrices per rollout batch"),
        samples_per_matrix: int = typer.Option(None, help="completions per matrix per step (GRPO group size)"),
        lr: float = typer.Option(None, help="learning rate"),
        kl_loss_coef: float = typer.Option(None, help="weight of the KL-to-reference loss on every response "
                                                      "token"),
        kl_coef: float = typer.Option(None, help="PPO only: KL penalty in the reward"),
        pg_token_share: float = typer.Option(None, help="share of tokens (highest sampling entropy) that get the "
                                                        "policy-gradient loss (1.0 = every token)"),
        reward: str = typer.Option(None, help="clipped_log, relative_best or paper"),
        max_new_tokens: int = typer.Option(None, help="longest completion, in tokens [default: the longest library "
                                                           "kernel in the policy's tokens, plus a margin]"),
        resume: bool = typer.Option(None, "--resume", help="continue from OUT/state.pt"),
        force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
        compile_only: bool = typer.Option(None, "--compile-only", help="rewards from compiling only (smoke runs); "
                                                                       "the default without a GPU"),
        device: str = typer.Option(None, help="auto, cpu or cuda[:N]"),
    ) -> None:
        from sparserl.rl.trainer import train_rl  # torch

        given = {"model": str(model) if model else None, "matrices": str(matrices) if matrices else None,
                 "out": str(out) if out else None, "steps": steps, "matrices_per_step": matrices_per_step,
                 "samples_per_matrix": samples_per_matrix, "lr": lr, "kl_coef": kl_coef, "kl_loss_coef": kl_loss_coef,
                 "pg_token_share": pg_token_share,
                 "max_new_tokens": max_new_tokens, "device": device, "resume": resume, "compile_only": compile_only,
                 "reward": RewardConfig(name=reward) if reward else None}
        cfg = rl_config(algo, config, given)
        check_output(cfg.out, algo, force, cfg.resume)
        if not cfg.compile_only and fallback(False):
            cfg = dataclasses.replace(cfg, compile_only=True)
        typer.echo(json.dumps(train_rl(cfg), indent=1, default=str))

    cmd.__doc__ = (f"Stage 3: {algo.upper()} with rewards from the harness "
                   + ("(clipped ratio, leave-one-out baseline or a critic, KL-to-reference loss)." if algo == "ppo"
                      else "(group-relative rewards, no critic, KL-to-reference loss)."))
    return cmd


ppo_cmd = _rl("ppo")
grpo_cmd = _rl("grpo")
