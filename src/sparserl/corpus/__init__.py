"""The CUDA pre-training corpus built from packages on the public index (``sparserl corpus``)."""
