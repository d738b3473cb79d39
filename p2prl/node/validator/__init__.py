"""The validator role: judge announced rollout batches against the version that made them."""
