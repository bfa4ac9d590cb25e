"""The toy world: synthetic GSM8K, StrategyQA and MathQA in the real files' formats, each with
three expert trajectory sets rendered from one symbolic solution (see `world.py`)."""
