"""The one error a model's files raise (a module of its own: model_dir.py and every family's modules
raise it, and the families are imported by model_dir.py)."""


class ModelDirError(ValueError):
    """The model directory does not meet the contract; the message says what to fix."""
