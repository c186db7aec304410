"""The policy model: tokenizer, the embedded default config, and the policy wrapper."""
