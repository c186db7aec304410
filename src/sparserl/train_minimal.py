"""``python -m sparserl.train_minimal``: the paper's PPO script, by its name (:func:`sparserl.cli.paper.train_minimal`)."""

import sys

from sparserl.cli.paper import train_minimal as main

if __name__ == "__main__":
    sys.exit(main())
