"""The trainer role: verified rollouts in, GRPO steps, one signed patch per published version out."""
