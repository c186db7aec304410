"""Training stages: pre-training (stage 1) and supervised fine-tuning (stage 2)."""
