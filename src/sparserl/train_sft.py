"""``python -m sparserl.train_sft``: the paper's SFT script, by its name (:func:`sparserl.cli.paper.train_sft`)."""

import sys

from sparserl.cli.paper import train_sft as main

if __name__ == "__main__":
    sys.exit(main())
