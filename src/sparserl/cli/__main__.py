"""``python -m sparserl.cli`` (what ``torchrun -m sparserl.cli`` starts on every rank)."""

from sparserl.cli import main

main()
