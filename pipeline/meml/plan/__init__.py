"""The grid: which cells a config asks for and what each one reads (grid), and where every file of a
run lives (layout). Imports meml.core and meml.data."""
