"""MEML-GRPO reproduction harness: data, answer checking, toy world, tiny models, training and evaluation."""

__version__ = "0.1.0"
