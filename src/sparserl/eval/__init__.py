"""Evaluation: metrics (pass@k, fast_p, geometric means), baselines, reports."""
