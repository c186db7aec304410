"""Training data: the CUDA text corpus for pre-training, and (matrix, kernel) pairs for SFT."""
