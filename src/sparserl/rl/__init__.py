"""Reinforcement learning: PPO and GRPO maths (core), rollouts, trainers."""
