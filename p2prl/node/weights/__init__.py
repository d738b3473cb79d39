"""The weights a miner or validator runs: the genesis model, the live tensors patched in place, the
sync thread that fetches the next version, the engine and the saved copy."""
