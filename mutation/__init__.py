"""Mutation proof: the ablation runner and its pytest plugin (not shipped in the wheel)."""
