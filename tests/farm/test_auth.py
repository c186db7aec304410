"""Where the farm finds a Ray authentication token: Ray's own order (the variable, the variable
naming a file, the default file under the home folder). The cluster fixture checks that a token
found this way is really sent (tests/farm/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from sparserl.farm.auth import auth_token_source, node_auth_env


def test_the_token_is_found_in_rays_order(tmp_path: Path) -> None:
    """Kills a lookup that skips a source or takes them in another order."""
    home = tmp_path / "home"
    assert auth_token_source({"HOME": str(home)}) is None
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("ab" * 32)
    assert auth_token_source({"HOME": str(home)}) == str(home / ".ray" / "auth_token")
    env = {"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}
    assert auth_token_source(env) == str(tmp_path / "t")
    assert auth_token_source(env | {"RAY_AUTH_TOKEN": "cd" * 32}) == "RAY_AUTH_TOKEN"
    assert auth_token_source({"HOME": str(home), "RAY_AUTH_TOKEN": ""}) == str(home / ".ray" / "auth_token")


def test_nodes_join_with_the_token_when_there_is_one(tmp_path: Path) -> None:
    """Kills worker nodes started without the mode where a token exists (they are refused by a head
    that wants it: a local cluster on a machine where ray.init() ever ran) and a mode the user set
    being overridden."""
    home = tmp_path / "home"
    assert node_auth_env({"HOME": str(home)}) == {}
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("ab" * 32)
    assert node_auth_env({"HOME": str(home)}) == {"RAY_AUTH_MODE": "token"}
    assert node_auth_env({"HOME": str(home), "RAY_AUTH_MODE": "disabled"}) == {}
