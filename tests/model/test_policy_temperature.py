"""One temperature for serving the policy, another for learning: every path that asks a trained policy for kernels
(``generate``, ``evaluate``, the model-guided search, SFT's validation) samples at
:data:`sparserl.model.config.POLICY_TEMPERATURE` by default, and every path that learns from its samples (``improve``,
the RL rollouts) at 1.0. Kills: a serving path given its own number (a literal, even one equal to the constant
today), and a learning path that takes the serving temperature (its exploration narrowed)."""

from __future__ import annotations

from dataclasses import fields

from sparserl.eval.compare import EvalConfig
from sparserl.generate import GenerateConfig
from sparserl.improve.config import ImproveConfig
from sparserl.model.config import POLICY_TEMPERATURE
from sparserl.rl.config import RLConfig
from sparserl.search.run import SearchJob
from sparserl.train.config import SFTConfig


def _default(cls, name: str) -> float:
    return next(f.default for f in fields(cls) if f.name == name)


def test_serving_paths_sample_at_the_policys_temperature_and_learning_at_one() -> None:
    assert POLICY_TEMPERATURE < 1.0  # below the trained distribution's: fewer corrupted long completions
    serving = {c.__name__: _default(c, "temperature") for c in (GenerateConfig, EvalConfig, SearchJob)}
    serving["SFTConfig.eval_temperature"] = _default(SFTConfig, "eval_temperature")
    assert serving == dict.fromkeys(serving, POLICY_TEMPERATURE)
    # the constant itself, not a number equal to it today: a literal 0.7 written in a config is another object
    assert all(t is POLICY_TEMPERATURE for t in serving.values()), serving
    assert {c.__name__: _default(c, "temperature") for c in (ImproveConfig, RLConfig)} == {
        "ImproveConfig": 1.0, "RLConfig": 1.0}


def test_the_policy_script_defaults_to_the_same_temperature() -> None:
    """scripts/policy_at_scale.sh names the constant's value once (``policy_t``, TEMPERATURE's default). Kills the
    script's default left behind when the constant moves."""
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "scripts" / "policy_at_scale.sh").read_text()
    (value,) = re.findall(r"^policy_t=([0-9.]+)", script, flags=re.M)
    assert float(value) == POLICY_TEMPERATURE
    assert "${TEMPERATURE:-$policy_t}" in script and "${TEMPERATURE:-0" not in script
