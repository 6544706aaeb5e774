"""What differs between training under TensorFlow and under JAX: the compiled step, how the work
is spread over devices, and checkpoint I/O. `training/train.py` drives either through the same
interface (`Backend`), so the loop, flags, run folder, logs and evaluation exist once.

    tensorflow   tf.distribute (one device, MirroredStrategy, multi-worker, TPUStrategy where TF
                 has a TPU build); tf.train.Checkpoint files in DIR/checkpoints/
    jax          jax.jit over every local device (TPU chips, GPUs, or host CPUs), data-parallel;
                 checkpoint folders in DIR/checkpoints/ (Keras weights, optimizer, data position)

The backend is Keras' (`KERAS_BACKEND`), fixed when Keras is imported.
"""

import keras

BACKENDS = ("tensorflow", "jax")


class Backend:
    """The interface `training.train` uses. After `build`, `model` and `optimizer` exist.

    name: "tensorflow" or "jax".
    is_chief: whether this process writes checkpoints, logs and metrics.
    num_replicas: devices the global batch is split over.
    process_index, num_processes: which of the processes that read the training data in
        shares this one is (its share: `tokenized.TokenizedShards(..., process_index, num_processes)`).
    local_replicas: devices this process' rows of a batch are split over; its batches' sizes
        are multiples of it.
    """

    name = None
    is_chief = True
    num_replicas = local_replicas = 1
    process_index, num_processes = 0, 1

    def build(self, config, make_optimizer):
        """Creates `self.model` (a `Transformer` of `config`) and `self.optimizer`."""
        raise NotImplementedError

    def compile(self, label_smoothing, jit_compile=True, accumulate_steps=1):
        """Prepares the compiled training step: each optimizer update from the gradient of
        `accumulate_steps` batches' summed loss over all of their target tokens, as if they were
        one batch."""
        raise NotImplementedError

    def train_steps(self, iterator, num_steps):
        """Runs `num_steps` updates on batches from `iterator` (`accumulate_steps` batches each);
        returns (mean loss per target token, target tokens, training pairs dropped for length so
        far) as Python numbers."""
        raise NotImplementedError

    @property
    def step(self):
        """The number of optimizer updates so far (the schedule's step)."""
        raise NotImplementedError

    def agree(self, value):
        """Process 0's `value` (a float) in every process, so that all decide alike."""
        return value

    def restore(self, run, iterator, keep):
        """Prepares checkpointing into the `RunFolder` `run` (keeping the last `keep`) of the
        model, optimizer, `iterator`'s position and training time, and restores the latest
        checkpoint there. Returns (its path, training seconds so far), or (None, 0.0)."""
        raise NotImplementedError

    def save(self, step, train_seconds):
        """Writes checkpoint `step`; returns its path."""
        raise NotImplementedError

    def sync_model(self):
        """Makes `self.model`'s variables hold the trained values (for evaluation)."""

    def close(self):
        """Releases what training held (a worker's scratch checkpoints)."""


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
