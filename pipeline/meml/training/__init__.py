"""Multi-expert SFT (sft) and the RL loop (rl) with its parts: losses, the hard-example buffer,
rollout engines, checkpoints, data parallelism. Imports the layers below: core, data. The planner
(meml.plan) sits above: only the job module (training/jobs.py) asks the grid anything."""
