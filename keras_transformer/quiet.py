"""Quiet command lines: TensorFlow's C++ start-up lines (oneDNN notices, CUDA probing on a machine
without a GPU) stay out of what a command prints. Set TF_CPP_MIN_LOG_LEVEL=0 to see them; a
level of 1 or more is kept (a process started by another command inherits its 3).

Every command-line entry point calls `quiet_tensorflow()` before anything imports TensorFlow.
"""

import contextlib
import os
import sys


def quiet_tensorflow():
    """Imports TensorFlow and tensorflow_text with their C++ logs silenced, unless
    TF_CPP_MIN_LOG_LEVEL is 0. Python errors and warnings still show."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0" or "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # later C++ logs: errors too (Python raises them anyway)
    with _stderr_to_devnull():  # the lines logged while importing, before any setting is read
        import tensorflow  # noqa: F401
        import tensorflow_text  # noqa: F401


@contextlib.contextmanager
def _stderr_to_devnull():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
