"""What each `meml` command runs: a config and a job's names in, the stage's function called with
everything it needs from the config, the layout (meml.plan) and a method's switches. The glue between
the planner and the stages, above both: data (toy world, tiny models, prepared data, trajectories),
training (SFT, RL), evaluation (lm-eval, calibration, complementarity)."""
