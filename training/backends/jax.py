"""Training under JAX: forward, backward and Adam update as one `jax.jit` program over every local
device (TPU chips, GPUs, or host CPUs), data-parallel; checkpoints as folders that either backend
reads.

The step is stateless (`Transformer.stateless_call`, `Optimizer.stateless_apply`): the weights,
the dropout seeds and the optimizer's slots live in JAX arrays replicated on every device, each
batch is split by rows across the devices, and XLA sums the gradients. Each bucket shape of the
data pipeline compiles once.

A checkpoint is a folder `DIR/checkpoints/ckpt-STEP/`:

    model.weights.h5      the model's weights, Keras' own format (`Transformer.load_weights`
                          reads it under either backend: evaluation and export use it)
    training_state.npz    the optimizer's variables and the model's dropout seed state
    data.index, data-*    the tf.data iterator's position (tf.train.Checkpoint)
    state.json            step, training seconds, backend

It is written into a hidden folder and renamed into place, so a crash mid-save leaves the
previous checkpoints as they were.
"""

import json
import os
import shutil

import jax
import keras
import numpy as np
import tensorflow as tf

from keras_transformer import Transformer
from training.backends import Backend
from training.loss import smoothed_cross_entropy

# The batch fields the step reads (`dropped_pairs` is read on the host).
STEP_INPUTS = ("source", "target_input", "target_output", "batch_tokens")
STRATEGIES = ("auto", "tpu", "cpu")


def local_devices(strategy_name="auto"):
    """The devices to train on: `auto`, every local device of JAX's default platform; `tpu`, the
    TPU chips (an error naming the platform found if there are none); `cpu`, the host CPUs."""
    if strategy_name not in STRATEGIES:
        raise ValueError(
            f"--strategy {strategy_name!r} is a tf.distribute strategy; under JAX choose {', '.join(STRATEGIES)} "
            "(JAX trains data-parallel over every local device)."
        )
    if strategy_name == "cpu":
        return jax.local_devices(backend="cpu")
    devices = jax.local_devices()
    if strategy_name == "tpu" and devices[0].platform != "tpu":
        raise ValueError(
            f"--strategy tpu: JAX sees no TPU, only {len(devices)} {devices[0].platform} device(s). On Colab, "
            "pick a TPU runtime (Runtime > Change runtime type); elsewhere install jax[tpu] on a TPU VM."
        )
    return devices


class JaxBackend(Backend):
    """Trains with `jax.jit`, data-parallel over the devices of `local_devices(strategy_name)`.

    Args:
        strategy_name: `--strategy`: auto, tpu or cpu.
        mixed_precision: bfloat16 compute with float32 weights (`mixed_bfloat16`).
    """

    name = "jax"

    def __init__(self, strategy_name="auto", mixed_precision=False):
        devices = local_devices(strategy_name)
        self.mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
        self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.split_rows = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("batch"))
        self.num_replicas = len(devices)
        if mixed_precision:
            keras.mixed_precision.set_global_policy("mixed_bfloat16")
        self.run = self.checkpoint = None

    def build(self, config, make_optimizer):
        with jax.default_device(self.mesh.devices.flat[0]):
            self.model = Transformer(config)
            self.optimizer = make_optimizer()
            self.optimizer.build(self.model.trainable_variables)
        self._iterations = next(i for i, v in enumerate(self.optimizer.variables) if v is self.optimizer.iterations)

    def _state_from_variables(self):
        """(trainable, non-trainable, optimizer) values, replicated on every device."""
        values = tuple(
            [v.value for v in variables]
            for variables in (self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables)
        )
        return jax.device_put(values, self.replicated)

    def sync_model(self):
        for variables, values in zip(
            (self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables), self.state
        ):
            for variable, value in zip(variables, values):
                variable.assign(value)

    def compile(self, label_smoothing, jit_compile=True):
        if not jit_compile:
            raise ValueError("--no-xla is for the TensorFlow backend: JAX always compiles the step with XLA.")
        model, optimizer = self.model, self.optimizer

        def loss_fn(trainable, non_trainable, batch):
            inputs = (batch["source"], batch["target_input"])
            logits, non_trainable = model.stateless_call(trainable, non_trainable, inputs, training=True)
            loss_sum, tokens = smoothed_cross_entropy(batch["target_output"], logits, label_smoothing)
            # Divided by the whole batch's token count: the mean over the global batch.
            return loss_sum / batch["batch_tokens"][0].astype("float32"), (loss_sum, tokens, non_trainable)

        def step(state, batch):
            trainable, non_trainable, optimizer_variables = state
            gradient_fn = jax.value_and_grad(loss_fn, has_aux=True)
            (_, (loss_sum, tokens, non_trainable)), gradients = gradient_fn(trainable, non_trainable, batch)
            trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, gradients, trainable)
            return (trainable, non_trainable, optimizer_variables), loss_sum, tokens

        self.state = self._state_from_variables()  # from here on, the training state is this
        self.step_fn = jax.jit(
            step,
            in_shardings=(self.replicated, self.split_rows),
            out_shardings=(self.replicated, self.replicated, self.replicated),
            donate_argnums=0,
        )

    def train_steps(self, iterator, num_steps):
        loss_total, tokens_total, dropped = 0.0, 0.0, 0
        for _ in range(num_steps):
            batch = next(iterator)
            dropped = int(batch["dropped_pairs"][0])
            arrays = jax.device_put({name: batch[name].numpy() for name in STEP_INPUTS}, self.split_rows)
            self.state, loss_sum, tokens = self.step_fn(self.state, arrays)  # dispatched; runs while the host reads on
            loss_total, tokens_total = loss_total + loss_sum, tokens_total + tokens
        return float(loss_total / tokens_total), float(tokens_total), dropped

    @property
    def step(self):
        return int(self.state[2][self._iterations])

    # Checkpoints.

    def restore(self, run, iterator, keep):
        self.run, self.keep = run, keep
        self.checkpoint = tf.train.Checkpoint(data=iterator)
        for name in os.listdir(run.checkpoint_dir) if os.path.isdir(run.checkpoint_dir) else []:
            if name.startswith(".ckpt-"):  # a save that a crash interrupted
                shutil.rmtree(os.path.join(run.checkpoint_dir, name), ignore_errors=True)
        checkpoints = run.checkpoints()
        if not checkpoints:
            return None, 0.0
        _, path = checkpoints[-1]
        self.model.load_weights(os.path.join(path, "model.weights.h5"))
        with np.load(os.path.join(path, "training_state.npz")) as saved:
            for prefix, variables in (("non_trainable", self.model.non_trainable_variables),
                                      ("optimizer", self.optimizer.variables)):  # fmt: skip
                for index, variable in enumerate(variables):
                    value = saved[f"{prefix}/{index}"]
                    if tuple(value.shape) != tuple(variable.shape):
                        raise ValueError(f"{path}: {variable.path} has shape {value.shape}, the model {variable.shape}.")
                    variable.assign(value)
        self.checkpoint.read(os.path.join(path, "data")).assert_consumed()
        self.state = self._state_from_variables()
        with open(os.path.join(path, "state.json")) as f:
            return path, json.load(f)["train_seconds"]

    def save(self, step, train_seconds):
        run = self.run
        target = os.path.join(run.checkpoint_dir, f"ckpt-{step}")
        staging = os.path.join(run.checkpoint_dir, f".ckpt-{step}-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        self.sync_model()
        self.model.save_weights(os.path.join(staging, "model.weights.h5"))
        arrays = {f"non_trainable/{i}": np.asarray(v) for i, v in enumerate(self.state[1])}
        arrays.update({f"optimizer/{i}": np.asarray(v) for i, v in enumerate(self.state[2])})
        np.savez(os.path.join(staging, "training_state.npz"), **arrays)
        self.checkpoint.write(os.path.join(staging, "data"))
        with open(os.path.join(staging, "state.json"), "w") as f:
            json.dump({"step": step, "train_seconds": train_seconds, "backend": self.name}, f)
        if os.path.exists(target):  # the same step saved again (a rerun): replace it
            shutil.rmtree(target)
        os.rename(staging, target)
        for _, old in run.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target
