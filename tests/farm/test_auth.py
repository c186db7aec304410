"""Where the farm finds a Ray authentication token: Ray's own order (the variable, the variable
naming a file, the default file under the home folder). The cluster fixture checks that a token
found this way is really sent (tests/farm/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

from sparserl.farm.auth import auth_token_source, node_auth_env, use_token_auth


def test_the_token_is_found_in_rays_order(tmp_path: Path) -> None:
    """Kills a lookup that skips a source or takes them in another order."""
    home = tmp_path / "home"
    assert auth_token_source({"HOME": str(home)}) is None
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("ab" * 32)
    assert auth_token_source({"HOME": str(home)}) == str(home / ".ray" / "auth_token")
    (tmp_path / "t").write_text("cd" * 32)
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


def test_the_token_is_sent_only_to_a_cluster_that_asks_for_it(tmp_path: Path, monkeypatch) -> None:
    """Kills sending the token whatever the cluster: a cluster without authentication then lets the
    driver join but its raylets refuse the driver's calls back, and every GPU actor dies before it
    starts (Ray 2.60). Also a token path that names no file."""
    token = tmp_path / "auth_token"
    token.write_text("ab" * 32)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    asked = []
    assert use_token_auth("h:1", wants=lambda a: asked.append(a) or True) is None and asked == []
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert use_token_auth("h:1", wants=lambda a: asked.append(a) or False) is None and asked == ["h:1"]
    assert use_token_auth("h:1", wants=lambda a: None) is None
    assert "RAY_AUTH_MODE" not in os.environ
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert use_token_auth("h:1", wants=lambda a: True) is None
