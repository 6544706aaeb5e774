"""The interface `training/train.py` drives either backend through (training/backends/)."""


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
