"""What differs between training under TensorFlow and under JAX: the compiled step, how the work
is spread over devices, and checkpoint I/O. `training/train.py` drives either through the same
interface (`base.Backend`), so the loop, flags, run folder, logs and evaluation exist once.

    tensorflow   tf.distribute (one device, MirroredStrategy, multi-worker, TPUStrategy where TF
                 has a TPU build); tf.train.Checkpoint files in DIR/checkpoints/
    jax          jax.jit over every local device (TPU chips, GPUs, or host CPUs), data-parallel;
                 checkpoint folders in DIR/checkpoints/ (Keras weights, optimizer, data position)

The backend is Keras' (`KERAS_BACKEND`), fixed when Keras is imported.
"""

import keras

from training.flags import BACKENDS


def current():
    """Keras' backend, if this project can train on it."""
    name = keras.config.backend()
    if name not in BACKENDS:
        raise ValueError(f"Keras runs on {name!r}; training.train supports {', '.join(BACKENDS)} (KERAS_BACKEND).")
    return name


def create(strategy_name="auto", strategy=None, mixed_precision=False, processes=None):
    """The `Backend` for Keras' current backend. `strategy_name` is `--strategy`; `strategy`, a
    tf.distribute strategy made already (TensorFlow only); `processes`, the arguments of
    `jax.initialize_processes` to train on several processes as one (JAX only)."""
    if current() == "jax":
        from training.backends.jax import JaxBackend, initialize_processes

        if strategy is not None:
            raise ValueError("A tf.distribute strategy was given, but Keras runs on JAX.")
        if processes is not None:
            initialize_processes(**processes)
        return JaxBackend(strategy_name, mixed_precision=mixed_precision)
    if processes is not None:
        raise ValueError("Several processes train as one under JAX; TensorFlow's workers come from TF_CONFIG.")
    from training.backends.tensorflow import TensorFlowBackend

    return TensorFlowBackend(strategy_name, strategy, mixed_precision=mixed_precision)
