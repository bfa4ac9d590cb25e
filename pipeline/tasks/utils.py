"""lm-eval loads the task hooks from a `utils.py` beside the YAML files; they live in the package."""

from meml.evaluation.lm_task_hooks import accuracy, doc_to_text, extract_lenient, extract_strict, load_prepared

__all__ = ["accuracy", "doc_to_text", "extract_lenient", "extract_strict", "load_prepared"]
