"""Config files a user writes wrong (``sparserl ppo/grpo --config F``): each is one SparseRLError line naming
the file and what is wrong, never a traceback from the parser or from a comparison deep in the config's checks.
Killed mutations: the parsers' errors let through (a TOMLDecodeError or YAMLError traceback); the type check
removed (``steps = "abc"`` reached ``steps >= 1`` as a TypeError, ``steps = 1.5`` was taken); a bool taken for an
int; the reward table's keys unchecked (a TypeError from RewardConfig)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.checks import check_setting_types
from sparserl.errors import SparseRLError
from sparserl.rl.config import RLConfig, load_config_file


@pytest.mark.parametrize("name, text, message", [
    ("a.toml", 'steps = "abc"\n', "a.toml: steps must be an int, got 'abc'"),
    ("a.toml", "steps = 1.5\n", "a.toml: steps must be an int, got 1.5"),
    ("a.toml", "steps = true\n", "a.toml: steps must be an int, got True"),
    ("a.toml", 'lr = "fast"\n', "a.toml: lr must be a float, got 'fast'"),
    ("a.toml", 'critic = "yes"\n', "a.toml: critic must be a bool, got 'yes'"),
    ("a.toml", "[[[\n", "a.toml: not valid TOML: "),
    ("a.yaml", "steps: [1\n  bad\n", "a.yaml: not valid YAML: "),
    ("a.yaml", "- 1\n- 2\n", "a.yaml: a config file holds settings by name (key = value), got a list"),
    ("a.toml", "[reward]\nfoo = 1\n", "a.toml: unknown reward settings ['foo']"),
    ("a.toml", 'reward = 3\n', "a.toml: reward must be a table of settings, got 3"),
    ("a.toml", '[reward]\nclip = "x"\n', "a.toml [reward]: clip must be a float, got 'x'"),
    ("a.json", "{}", "a.json: config files are .toml or .yaml"),
])
def test_a_wrong_config_file_is_one_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(SparseRLError) as e:
        load_config_file(f)
    assert str(e.value).startswith(str(tmp_path / message)) and "\n" not in str(e.value)


def test_a_folder_or_binary_file_named_as_a_config(tmp_path: Path) -> None:
    (tmp_path / "d.toml").mkdir()
    with pytest.raises(SparseRLError, match="not a file"):
        load_config_file(tmp_path / "d.toml")
    (tmp_path / "b.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SparseRLError, match="not a text file"):
        load_config_file(tmp_path / "b.toml")


def test_right_types_pass_and_optional_ones_take_nothing() -> None:
    check_setting_types({"steps": 3, "lr": 1, "critic": False, "target_kl": None, "algo": "grpo"}, RLConfig, "f")
    with pytest.raises(SparseRLError, match="target_kl must be a float \\(or left out\\), got 'x'"):
        check_setting_types({"target_kl": "x"}, RLConfig, "f")
    with pytest.raises(SparseRLError, match="algo must be a str, got None"):
        check_setting_types({"algo": None}, RLConfig, "f")
