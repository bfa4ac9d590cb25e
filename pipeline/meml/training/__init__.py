"""Multi-expert SFT (sft) and the RL loop (rl) with its parts: losses, the hard-example buffer,
rollout engines, checkpoints, data parallelism, and the probes that measure a step (probe, memory).
Imports the layers below: core, data. The planner (meml.plan) and the jobs (meml.jobs) sit above."""
