"""Ray's token authentication, as the farm meets it.

Ray (2.59 on) turns token authentication on for a cluster that ``ray start`` starts wherever a
token exists, and any earlier ``ray.init()`` on that machine leaves one in ``~/.ray/auth_token``.
But a process that joins such a cluster by its address (a driver's ``ray.init(address=...)``, a
worker node's ``ray start --address=...``) sends no token unless ``RAY_AUTH_MODE=token``, and is
refused after 20 s of retries. The farm therefore joins with the token whenever this machine has
one and the cluster asks for it (:func:`cluster_wants_token`, a call to its GCS without a token).
Only then: a driver in token mode joins a cluster without authentication, but that cluster's
raylets then refuse the driver's own calls back, and every actor dies before it starts (Ray
2.60). An explicit ``RAY_AUTH_MODE`` (``disabled`` included) is left as the user set it.
"""

from __future__ import annotations

import os
from pathlib import Path


def auth_token_source(env=os.environ) -> str | None:
    """Where this machine keeps a Ray authentication token (Ray's own order: ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), or None."""
    if env.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if env.get("RAY_AUTH_TOKEN_PATH"):  # a path to nothing is Ray's own error to give
        return env["RAY_AUTH_TOKEN_PATH"] if Path(env["RAY_AUTH_TOKEN_PATH"]).is_file() else None
    default = Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def cluster_wants_token(address: str, timeout_s: float = 5.0) -> bool | None:
    """Whether the cluster at ``address`` (``host:port`` of its GCS) refuses a call without a token:
    True, False, or None when this cannot tell (another error, a Ray without token authentication,
    a ``ray://`` or ``auto`` address). Asked by a process that is not in token mode yet (one that is
    sends its token, and hears False)."""
    if address == "auto" or "://" in address:
        return None
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:
        return None
    try:
        GcsClient(address=address, cluster_id=None).internal_kv_get(b"sparserl_probe", None, timeout=timeout_s)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 - unreachable, timed out ...: ray.init says it in its own words
        return None
    return False


def use_token_auth(address: str, wants=cluster_wants_token) -> str | None:
    """Join the cluster at ``address`` with token authentication when this machine has a token,
    ``RAY_AUTH_MODE`` is unset and the cluster asks for one (``wants``: the probe, replaceable in
    tests; module docstring); the token's source, or None when nothing changed. Ray reads the mode into
    its cached configuration when it is imported, so the variable alone does not reach this
    process: Ray's own switch (the one ``ray.init(address="auto")`` uses) sets both; a Ray without
    it (before token authentication existed) needs nothing."""
    if os.environ.get("RAY_AUTH_MODE"):
        return None
    source = auth_token_source()
    if source is None or wants(address) is not True:
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
