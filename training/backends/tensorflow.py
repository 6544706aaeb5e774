"""Training under TensorFlow: a tf.distribute strategy, an XLA-compiled forward and backward pass,
and tf.train.Checkpoint files (model, optimizer, data iterator, training time).

Under `MultiWorkerMirroredStrategy` each worker reads its own share of the training shards and
trains on its own rows of each global batch (their bucket drawn from one schedule, as under
JAX); worker 0's checkpoints are DIR/checkpoints/, worker w's (its position in its share, and
the replicated state) DIR/checkpoints/worker-w/.
"""

import os

import keras
import tensorflow as tf

from keras_transformer import PAD_ID, Transformer
from training import strategy as strategies
from training.backends.base import Backend
from training.loss import smoothed_cross_entropy
from training.run_folder import checkpoint_name, step_of


class TensorFlowBackend(Backend):
    """Trains under a tf.distribute strategy (`training/strategy.py` chooses it).

    Args:
        strategy_name: `--strategy`: auto, tpu, mirrored, multiworker or cpu.
        strategy: a strategy made already (overrides `strategy_name`).
        mixed_precision: bfloat16 on TPU and CPU, float16 with loss scaling on GPU.
    """

    name = "tensorflow"

    def __init__(self, strategy_name="auto", strategy=None, mixed_precision=False):
        self.strategy = strategy or strategies.make_strategy(strategy_name)
        self.is_chief = strategies.is_chief(self.strategy)
        self.num_replicas = self.strategy.num_replicas_in_sync
        self.local_replicas = strategies.local_replicas(self.strategy)
        self.process_index, self.num_processes = strategies.worker_index(self.strategy), self.num_replicas // self.local_replicas
        if mixed_precision:
            on_tpu = isinstance(self.strategy, tf.distribute.TPUStrategy)
            on_gpu = bool(tf.config.list_logical_devices("GPU")) and not on_tpu
            keras.mixed_precision.set_global_policy("mixed_float16" if on_gpu else "mixed_bfloat16")
        self.train_seconds = tf.Variable(0.0, trainable=False, dtype=tf.float64)
        self.manager = None

    def build(self, config, make_optimizer):
        with self.strategy.scope():
            self.model = Transformer(config)
            self.optimizer = make_optimizer()
            if keras.mixed_precision.global_policy().name == "mixed_float16":
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)

    def compile(self, label_smoothing, jit_compile=True, accumulate_steps=1):
        self.trainer = Trainer(self.model, self.optimizer, self.strategy, label_smoothing, jit_compile, accumulate_steps)

        @tf.function
        def value_of_replica_0(value):
            def replica_fn():
                context = tf.distribute.get_replica_context()
                return context.all_reduce("SUM", tf.where(context.replica_id_in_sync_group == 0, value, 0.0))

            return self.strategy.experimental_local_results(self.strategy.run(replica_fn))[0]

        self._value_of_replica_0 = value_of_replica_0

    def train_steps(self, iterator, num_steps):
        loss, tokens, dropped = self.trainer.train_steps(iterator, tf.constant(num_steps))
        return float(loss), float(tokens), int(dropped)  # waits for the steps to finish

    @property
    def step(self):
        return int(keras.ops.convert_to_numpy(self.optimizer.iterations))  # also for a MirroredVariable

    def agree(self, value):
        if self.num_processes == 1:
            return value
        return float(self._value_of_replica_0(tf.constant(value, tf.float32)))

    def restore(self, run, iterator, keep):
        checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, data=iterator, train_seconds=self.train_seconds
        )
        # Every worker saves (saving is collective), each into its own folder: its data position is its own.
        folders = [run.worker_checkpoint_dir(worker) for worker in range(self.num_processes)]
        self.manager = tf.train.CheckpointManager(checkpoint, folders[self.process_index], max_to_keep=keep)
        # The latest step that every worker saved (a crash may have stopped one before the others).
        saved = [_saved_steps(folder) for folder in folders]
        common = set.intersection(*saved)
        if not common:
            return None, 0.0
        latest = os.path.join(folders[self.process_index], checkpoint_name(max(common)))
        checkpoint.restore(latest).assert_consumed()
        return latest, float(self.train_seconds)

    def save(self, step, train_seconds):
        self.train_seconds.assign(train_seconds)
        return self.manager.save(checkpoint_number=step)


def _saved_steps(folder):
    state = tf.train.get_checkpoint_state(folder)
    return {step_of(path) for path in state.all_model_checkpoint_paths} if state else set()


class Trainer:
    """The compiled training step and the loop that drives it, under a tf.distribute strategy.

    Each update reads `accumulate_steps` batches and applies the gradient of their summed loss
    over all of their target tokens, as if they were one batch (fairseq's `--update-freq`).
    """

    def __init__(self, model, optimizer, strategy, label_smoothing=0.1, jit_compile=True, accumulate_steps=1):
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.local_replicas = strategies.local_replicas(strategy)
        self.label_smoothing = label_smoothing
        self.accumulate_steps = accumulate_steps
        # Forward and backward passes are one XLA computation. The update stays outside it: under
        # MirroredStrategy it all-reduces the gradients, which XLA cannot hold (on TPU all of it
        # is compiled anyway).
        self.loss_and_gradients = tf.function(self._loss_and_gradients, jit_compile=jit_compile)
        self.train_steps = tf.function(self._train_steps)

    def _loss_and_gradients(self, batch, global_tokens):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model((batch["source"], batch["target_input"]), training=True)
            loss_sum, tokens = smoothed_cross_entropy(batch["target_output"], logits, self.label_smoothing)
            # Every replica divides by the update's token count over all replicas and batches: the
            # summed gradients are those of the mean over all of them, however they are split.
            loss = loss_sum / global_tokens
            scaled_loss = self.optimizer.scale_loss(loss)
        return loss_sum, tokens, tape.gradient(scaled_loss, variables)

    def _replica_update(self, batches):
        """One update from this replica's rows of `batches`, the update's batches."""
        tokens = tf.add_n([tf.reduce_sum(tf.cast(batch["target_output"] != PAD_ID, tf.float32)) for batch in batches])
        global_tokens = tf.distribute.get_replica_context().all_reduce("SUM", tokens)
        loss_total, gradients = 0.0, None
        for batch in batches:
            # One batch's activations at a time: the graph would otherwise run the independent
            # passes side by side, and hold N batches' memory.
            with tf.control_dependencies(gradients or []):
                loss_sum, _, batch_gradients = self.loss_and_gradients(batch, global_tokens)
            loss_total += loss_sum
            gradients = batch_gradients if gradients is None else [a + b for a, b in zip(gradients, batch_gradients)]
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
        return loss_total, tokens, tf.reduce_max(batches[-1]["dropped_pairs"])

    def _train_steps(self, iterator, num_steps):
        """Runs `num_steps` updates in one call; returns the mean loss per target token, the
        number of target tokens, and the count of training pairs dropped for length so far.

        `iterator` is a plain tf.data iterator of this worker's rows of each global batch (so
        that a checkpoint can hold it: distributed iterators cannot be saved); each of the
        worker's replicas takes its own rows of them.
        """
        loss_total, tokens_total, dropped = tf.constant(0.0), tf.constant(0.0), tf.constant(0, tf.int64)
        for _ in tf.range(num_steps):
            per_replica = []
            for _ in range(self.accumulate_steps):
                batch = next(iterator)
                per_replica.append(self.strategy.experimental_distribute_values_from_function(
                    lambda context, batch=batch: _rows_of_replica(batch, context, self.local_replicas)))  # fmt: skip
            loss_sum, tokens, replica_dropped = self.strategy.run(self._replica_update, args=(per_replica,))
            loss_total += self.strategy.reduce("SUM", loss_sum, axis=None)
            tokens_total += self.strategy.reduce("SUM", tokens, axis=None)
            dropped = self.strategy.experimental_local_results(replica_dropped)[0]  # alike on all replicas
        return loss_total / tokens_total, tokens_total, dropped


def _rows_of_replica(batch, context, local_replicas):
    """The slice of a worker's rows of a global batch that one of its `local_replicas` trains on
    (a worker's replicas are numbered one after another)."""
    rows = tf.shape(batch["source"])[0] // local_replicas
    start = rows * (context.replica_id_in_sync_group % local_replicas)
    return {name: value[start : start + rows] for name, value in batch.items()}
