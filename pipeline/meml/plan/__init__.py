"""The grid: which cells a config asks for and what each one reads (grid), where every file of a run
lives (layout), what the grid costs (cost), and the checks before any job (targets, preflight).
Imports the layers below: core, data, training (preflight: the RL update's memory on the meta device)."""
