"""The grid: which cells a config asks for and what each one reads (grid), where every file of a run
lives (layout), what the grid costs (cost), and the checks before any job (targets, preflight).
Imports meml.core and meml.data; `meml cost --measure` alone reaches into meml.training (its probe)."""
