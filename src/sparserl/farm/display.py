"""The farm's progress: matrices done, the best speedups so far, evaluations/s per GPU, failures.

On a terminal a rich live panel redrawn every second; elsewhere (a log, CI) one line every
:data:`EVERY_S` seconds and one at the end.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

EVERY_S = 30.0
"""Seconds between progress lines off a terminal."""


class FarmDisplay:
    def __init__(self, farm, total: int, done_before: int, enabled: bool = True):
        from rich.console import Console

        self.farm, self.total, self.before = farm, total, done_before
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.live = None
        self.last = 0.0

    def __enter__(self) -> FarmDisplay:
        if self.enabled and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._panel(), console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self._panel())
            self.live.__exit__(*exc)
        elif self.enabled:
            log.info("%s", self.line())

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._panel())
        elif self.enabled and time.monotonic() - self.last >= EVERY_S:
            self.last = time.monotonic()
            log.info("%s", self.line())

    def line(self) -> str:
        s = self.farm.snapshot()
        done = s["done"] + self.before
        parts = [f"farm: {done}/{self.total} matrices done", f"{len(s['running'])} running"]
        if s["skipped"]:
            parts.append(f"{s['skipped']} skipped")
        if s["failed"]:
            parts.append(f"{s['failed']} failed")
        parts.append(f"{s['candidates']} candidates ({s['rate']:.1f}/s)")
        if s["machine_failures"]:
            parts.append("machine failures " + ", ".join(f"{k} {v}" for k, v in s["machine_failures"].items()))
        if s["best"]:
            parts.append("best " + ", ".join(f"{n} {x:.2f}x" for n, x in s["best"][:3]))
        if s["workers"]:
            parts.append("per GPU " + ", ".join(f"{w['name']} {w['rate']:.2f}/s" for w in s["workers"]))
        elif not s["timed"]:
            parts.append("compile-only")
        return "; ".join(parts)

    def _panel(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        s = self.farm.snapshot()
        head = Text(f"farm: {s['done'] + self.before}/{self.total} matrices done, {len(s['running'])} running, "
                    f"{s['skipped']} skipped, {s['failed']} failed; {s['candidates']} candidates "
                    f"({s['rate']:.1f}/s), {s['elapsed']:.0f} s"
                    + ("" if s["timed"] else "; compile-only (no GPU)"))
        parts = [head]
        if s["machine_failures"]:
            parts.append(Text("failures of the machine: " + ", ".join(f"{k} {v}" for k, v in
                                                                      s["machine_failures"].items()), style="yellow"))
        if s["workers"]:
            t = Table(title="GPUs", show_edge=False)
            for col in ("GPU", "host", "evaluations", "per s", "state"):
                t.add_column(col)
            for w in s["workers"]:
                probs = s["health"].get(w["name"])
                t.add_row(w["name"], str(w.get("host") or "-"), str(w["jobs"]), f"{w['rate']:.2f}",
                          "lost" if not w.get("alive", True) else ("; ".join(probs) if probs else "ok"))
            parts.append(t)
        if s["best"]:
            t = Table(title="best speedups so far", show_edge=False)
            t.add_column("matrix")
            t.add_column("vs cuSPARSE", justify="right")
            for name, x in s["best"]:
                t.add_row(name, f"{x:.2f}x")
            parts.append(t)
        if s["running"]:
            parts.append(Text("searching: " + ", ".join(s["running"][:8]) + (" ..." if len(s["running"]) > 8 else "")))
        return Group(*parts)
