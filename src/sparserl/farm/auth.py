"""Ray's token authentication, as the farm meets it.

Ray (2.59 on) turns token authentication on for a cluster that ``ray start`` starts wherever a
token exists, and any earlier ``ray.init()`` on that machine leaves one in ``~/.ray/auth_token``.
But a process that joins such a cluster by its address (a driver's ``ray.init(address=...)``, a
worker node's ``ray start --address=...``) sends no token unless ``RAY_AUTH_MODE=token``, and is
refused after 20 s of retries. The farm therefore joins with the token whenever this machine has
one: a cluster without authentication accepts a process that sends a token (Ray 2.60), so that
costs nothing. An explicit ``RAY_AUTH_MODE`` (``disabled`` included) is left as the user set it.
"""

from __future__ import annotations

import os
from pathlib import Path


def auth_token_source(env=os.environ) -> str | None:
    """Where this machine keeps a Ray authentication token (Ray's own order: ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), or None."""
    if env.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return env["RAY_AUTH_TOKEN_PATH"]
    default = Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def use_token_auth() -> str | None:
    """Join with token authentication when this machine has a token and ``RAY_AUTH_MODE`` is unset
    (module docstring); the token's source, or None when nothing changed. Ray reads the mode into
    its cached configuration when it is imported, so the variable alone does not reach this
    process: Ray's own switch (the one ``ray.init(address="auto")`` uses) sets both; a Ray without
    it (before token authentication existed) needs nothing."""
    if os.environ.get("RAY_AUTH_MODE"):
        return None
    source = auth_token_source()
    if source is None:
        return None
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth
    except ImportError:
        return None
    _enable_token_auth()
    return source


def node_auth_env(env: dict) -> dict:
    """What a node started by ``ray start`` in ``env`` needs added to join with this machine's
    token: ``RAY_AUTH_MODE=token`` when there is a token and no mode was set, else nothing."""
    if env.get("RAY_AUTH_MODE") or auth_token_source(env) is None:
        return {}
    return {"RAY_AUTH_MODE": "token"}
