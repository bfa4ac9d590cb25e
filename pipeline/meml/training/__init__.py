"""Multi-expert SFT (sft) and the RL loop (rl) with its parts: losses, the hard-example buffer,
rollout engines, checkpoints, data parallelism, and what a grid costs. Imports the layers below:
core, data, plan."""
