"""Accuracy through lm-eval (evaluate, lm_tasks), the calibration gate, and the complementarity
analysis. Imports the layers below: core, data, training, plan."""
