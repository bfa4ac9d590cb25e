"""MEML-GRPO reproduction harness, grouped by stage. Imports only point down this list:

    core        io, config, records, the answer checker, stop tokens, precision, MLflow tracking
    data        real loaders, the toy world, experts' prompts and trajectories, teachers, tiny models
    plan        the grid of cells and the layout of their files
    training    multi-expert SFT and the RL loop with its parts
    evaluation  lm-eval accuracy, the calibration gate, complementarity
    reporting   results, statistics, tables, the summary and the report

Above them: cli (the commands the rules call), run and worker (how a job runs), progress.
tests/test_layers.py holds the order."""

__version__ = "0.1.0"
