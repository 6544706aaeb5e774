"""Training under TensorFlow: a tf.distribute strategy, an XLA-compiled forward and backward pass,
and tf.train.Checkpoint files (model, optimizer, data iterator, training time)."""

import shutil
import tempfile

import keras
import tensorflow as tf

from keras_transformer import Transformer
from training import strategy as strategies
from training.backends import Backend
from training.loss import smoothed_cross_entropy


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
        self.num_replicas = self.local_replicas = self.strategy.num_replicas_in_sync  # every worker reads every batch
        self.several_workers = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
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

    def compile(self, label_smoothing, jit_compile=True):
        self.trainer = Trainer(self.model, self.optimizer, self.strategy, label_smoothing, jit_compile)

    def train_steps(self, iterator, num_steps):
        loss, tokens, dropped = self.trainer.train_steps(iterator, tf.constant(num_steps))
        return float(loss), float(tokens), int(dropped)  # waits for the steps to finish

    @property
    def step(self):
        return int(keras.ops.convert_to_numpy(self.optimizer.iterations))  # also for a MirroredVariable

    def restore(self, run, iterator, keep):
        checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, data=iterator, train_seconds=self.train_seconds
        )
        # Every worker saves (saving is collective); only the chief's copy is kept.
        directory = run.checkpoint_dir if self.is_chief else tempfile.mkdtemp(prefix="worker-checkpoints-")
        self.manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=keep)
        latest = tf.train.latest_checkpoint(run.checkpoint_dir)
        if not latest:
            return None, 0.0
        checkpoint.restore(latest)
        return latest, float(self.train_seconds)

    def save(self, step, train_seconds):
        self.train_seconds.assign(train_seconds)
        return self.manager.save(checkpoint_number=step)

    def close(self):
        if self.manager is not None and not self.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)


class Trainer:
    """The compiled training step and the loop that drives it, under a tf.distribute strategy."""

    def __init__(self, model, optimizer, strategy, label_smoothing=0.1, jit_compile=True):
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.label_smoothing = label_smoothing
        # Forward and backward passes are one XLA computation. The update stays outside it: under
        # MirroredStrategy it all-reduces the gradients, which XLA cannot hold (on TPU all of it
        # is compiled anyway).
        self.loss_and_gradients = tf.function(self._loss_and_gradients, jit_compile=jit_compile)
        self.train_steps = tf.function(self._train_steps)

    def _loss_and_gradients(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model((batch["source"], batch["target_input"]), training=True)
            loss_sum, tokens = smoothed_cross_entropy(batch["target_output"], logits, self.label_smoothing)
            # Every replica divides by the global batch's token count: the summed gradients are
            # those of the mean over the global batch, however it is split.
            loss = loss_sum / tf.cast(batch["batch_tokens"][0], tf.float32)
            scaled_loss = self.optimizer.scale_loss(loss)
        return loss_sum, tokens, tape.gradient(scaled_loss, variables)

    def _replica_step(self, batch):
        loss_sum, tokens, gradients = self.loss_and_gradients(batch)
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
        return loss_sum, tokens, tf.reduce_max(batch["dropped_pairs"])

    def _train_steps(self, iterator, num_steps):
        """Runs `num_steps` steps in one call; returns the mean loss per target token, the number
        of target tokens, and the count of training pairs dropped for length so far.

        `iterator` is a plain tf.data iterator of global batches (so that a checkpoint can hold
        it: distributed iterators cannot be saved); each replica takes its own rows of a batch.
        """
        loss_total, tokens_total, dropped = tf.constant(0.0), tf.constant(0.0), tf.constant(0, tf.int64)
        for _ in tf.range(num_steps):
            batch = next(iterator)
            per_replica = self.strategy.experimental_distribute_values_from_function(
                lambda context: _rows_of_replica(batch, context)
            )
            loss_sum, tokens, replica_dropped = self.strategy.run(self._replica_step, args=(per_replica,))
            loss_total += self.strategy.reduce("SUM", loss_sum, axis=None)
            tokens_total += self.strategy.reduce("SUM", tokens, axis=None)
            dropped = self.strategy.experimental_local_results(replica_dropped)[0]  # alike on all replicas
        return loss_total / tokens_total, tokens_total, dropped


def _rows_of_replica(batch, context):
    """The slice of a global batch that one replica trains on."""
    rows = tf.shape(batch["source"])[0] // context.num_replicas_in_sync
    start = rows * context.replica_id_in_sync_group
    return {name: value[start : start + rows] for name, value in batch.items()}
