"""Training under JAX: forward, backward and Adam update as one `jax.jit` program over every
device (TPU chips, GPUs, or host CPUs), data-parallel (with gradient accumulation, a program that
adds a batch's gradient and one that updates); checkpoints as folders that either backend reads.

Several hosts (a TPU pod slice's workers, or processes on one machine) train as one through
JAX's multi-controller runtime (`initialize_processes`): every process runs the same program over
one mesh of all their devices, reads its own share of the training shards, and feeds its own
rows of each global batch.

The step is stateless (`Transformer.stateless_call`, `Optimizer.stateless_apply`): the weights,
the dropout seeds and the optimizer's slots live in JAX arrays replicated on every device, each
batch is split by rows across the devices, and XLA sums the gradients. Each bucket shape of the
data pipeline compiles once; processes agree on every batch's bucket through a
`data.BucketSchedule`.

A checkpoint is a folder `DIR/checkpoints/ckpt-STEP/`:

    model.weights.h5      the model's weights, Keras' own format (`Transformer.load_weights`
                          reads it under either backend: evaluation and export use it)
    training_state.npz    the optimizer's variables and the model's dropout seed state
    data.index, data-*    the tf.data iterator's position (tf.train.Checkpoint); process p > 0
                          of several writes its own as data-p.index, data-p-*
    state.json            step, training seconds, backend

Process 0 writes the replicated state once, and state.json last, once every process has written
its part: a folder without it is an interrupted save, which is ignored and then removed. (No
folder is renamed: on a bucket a rename copies every file.)
"""

import contextlib
import json
import os
import re

import jax
import jax.numpy as jnp
import keras
from jax.experimental import multihost_utils
import numpy as np
import tensorflow as tf

from keras_transformer import Transformer
from training.backends.base import Backend
from training.loss import smoothed_cross_entropy
from training.run_folder import checkpoint_name, load_weights, local_copy, remove_tree, written_locally
from training.supervisor import LostProcess

# The batch fields the step reads (`dropped_pairs` is read on the host).
STEP_INPUTS = ("source", "target_input", "target_output")
STRATEGIES = ("auto", "tpu", "cpu")
# A process that stops answering for this long ends the others (JAX's default is 100 s;
# `--heartbeat-seconds`).
HEARTBEAT_SECONDS = 60
# How a collective's error reads when a peer is gone (gloo on CPUs, the coordination service).
PEER_LOST = re.compile(r"gloo|connection|socket|peer|unavailable|deadline", re.IGNORECASE)


def initialize_processes(coordinator_address=None, num_processes=None, process_id=None, heartbeat_seconds=HEARTBEAT_SECONDS):
    """Joins JAX's multi-controller runtime, before JAX touches a device.

    On Cloud TPU the first three arguments may be None: JAX finds them itself. Elsewhere give all
    three (the coordinator is process 0's HOST:PORT, which the others can reach). CPU devices
    reduce over gloo. If a process dies, the others end with an error within `heartbeat_seconds`
    (training/supervisor.py says so clearly).
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_seconds)


def training_devices(strategy_name="auto"):
    """The devices to train on, those of every process: `auto`, the devices of JAX's default
    platform; `tpu`, the TPU chips (an error naming the platform found if there are none);
    `cpu`, the host CPUs."""
    if strategy_name not in STRATEGIES:
        raise ValueError(
            f"--strategy {strategy_name!r} is a tf.distribute strategy; under JAX choose {', '.join(STRATEGIES)} "
            "(JAX trains data-parallel over every local device)."
        )
    if strategy_name == "cpu":
        return jax.devices("cpu")
    devices = jax.devices()
    if strategy_name == "tpu" and devices[0].platform != "tpu":
        raise ValueError(
            f"--strategy tpu: JAX sees no TPU, only {len(devices)} {devices[0].platform} device(s). On Colab, "
            "pick a TPU runtime (Runtime > Change runtime type); elsewhere install jax[tpu] on a TPU VM."
        )
    return devices


class JaxBackend(Backend):
    """Trains with `jax.jit`, data-parallel over the devices of `training_devices(strategy_name)`,
    those of every process when several run (`initialize_processes`).

    Args:
        strategy_name: `--strategy`: auto, tpu or cpu.
        mixed_precision: bfloat16 compute with float32 weights (`mixed_bfloat16`).
    """

    name = "jax"

    def __init__(self, strategy_name="auto", mixed_precision=False):
        devices = training_devices(strategy_name)
        # Sorted by process, so that each process' rows of a global batch lie on its own devices.
        devices = sorted(devices, key=lambda device: (device.process_index, device.id))
        self.mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
        self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.split_rows = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("batch"))
        self.num_replicas = len(devices)
        self.process_index, self.num_processes = jax.process_index(), jax.process_count()
        self.local_replicas = len(devices) // self.num_processes
        self.is_chief = self.process_index == 0
        if mixed_precision:
            keras.mixed_precision.set_global_policy("mixed_bfloat16")
        self.run = self.checkpoint = None

    def build(self, config, make_optimizer):
        with jax.default_device(jax.local_devices()[0]):
            self.model = Transformer(config)
            self.optimizer = make_optimizer()
            self.optimizer.build(self.model.trainable_variables)
        self._iterations = next(i for i, v in enumerate(self.optimizer.variables) if v is self.optimizer.iterations)

    def _state_from_variables(self):
        """(trainable, non-trainable, optimizer) values, replicated on every device (each process
        gives its copy: they are equal, from the same seed or checkpoint)."""
        values = tuple(
            [np.asarray(v.value) for v in variables]
            for variables in (self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables)
        )
        return jax.device_put(values, self.replicated)

    def sync_model(self):
        for variables, values in zip(
            (self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables), self.state
        ):
            for variable, value in zip(variables, values):
                variable.assign(np.asarray(value))  # a host copy: the model then runs on this process alone

    def compile(self, label_smoothing, jit_compile=True, accumulate_steps=1):
        if not jit_compile:
            raise ValueError("--no-xla is for the TensorFlow backend: JAX always compiles the step with XLA.")
        model, optimizer = self.model, self.optimizer

        def loss_fn(trainable, non_trainable, batch):
            inputs = (batch["source"], batch["target_input"])
            logits, non_trainable = model.stateless_call(trainable, non_trainable, inputs, training=True)
            loss_sum, tokens = smoothed_cross_entropy(batch["target_output"], logits, label_smoothing)
            return loss_sum, (tokens, non_trainable)  # sums over the global batch (XLA reduces across devices)

        def gradients(state, batch):
            """The state with the dropout seeds advanced, and (the gradient of the batch's summed
            loss, that sum, its target tokens)."""
            trainable, non_trainable, optimizer_variables = state
            (loss_sum, (tokens, non_trainable)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, non_trainable, batch)
            return (trainable, non_trainable, optimizer_variables), (grads, loss_sum, tokens)

        def accumulate(state, summed, batch):
            """`summed` (gradient, loss sum, tokens) with the batch's added."""
            state, added = gradients(state, batch)
            return state, jax.tree.map(jnp.add, summed, added)

        def apply(state, summed):
            """One Adam update from the summed gradient over the summed target tokens: the mean
            over every batch of the update, as if they were one."""
            trainable, non_trainable, optimizer_variables = state
            grads, loss_sum, tokens = summed
            grads = jax.tree.map(lambda grad: grad / tokens, grads)
            trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
            return (trainable, non_trainable, optimizer_variables), loss_sum, tokens

        def empty(state):  # the sums of no batch yet
            return jax.tree.map(jnp.zeros_like, state[0]), jnp.zeros((), "float32"), jnp.zeros((), "float32")

        self.state = self._state_from_variables()  # from here on, the training state is this
        self.accumulate_steps = accumulate_steps
        replicated = self.replicated
        # One batch an update is one program; more are one program per batch and one for the update.
        self.step_fn = jax.jit(lambda state, batch: apply(*gradients(state, batch)), in_shardings=(replicated, self.split_rows),
                               out_shardings=(replicated, replicated, replicated), donate_argnums=0)  # fmt: skip
        self.accumulate_fn = jax.jit(accumulate, in_shardings=(replicated, replicated, self.split_rows),
                                     out_shardings=(replicated, replicated), donate_argnums=(0, 1))  # fmt: skip
        self.apply_fn = jax.jit(apply, out_shardings=(replicated, replicated, replicated), donate_argnums=(0, 1))
        self.empty_fn = jax.jit(empty, out_shardings=replicated)

    def train_steps(self, iterator, num_steps):
        loss_total, tokens_total, dropped = 0.0, 0.0, 0
        with self._collective("the training steps' gradient all-reduce"):
            for _ in range(num_steps):  # dispatched; the host reads on
                if self.accumulate_steps == 1:
                    batch, dropped = self._next_batch(iterator)
                    self.state, loss_sum, tokens = self.step_fn(self.state, batch)
                else:
                    summed = self.empty_fn(self.state)
                    for _ in range(self.accumulate_steps):
                        batch, dropped = self._next_batch(iterator)
                        self.state, summed = self.accumulate_fn(self.state, summed, batch)
                    self.state, loss_sum, tokens = self.apply_fn(self.state, summed)
                loss_total, tokens_total = loss_total + loss_sum, tokens_total + tokens
            return float(loss_total / tokens_total), float(tokens_total), dropped

    def _next_batch(self, iterator):
        """This process' rows of the next global batch, as global arrays, and the count of pairs
        dropped for length so far."""
        batch = next(iterator)
        arrays = {name: jax.make_array_from_process_local_data(self.split_rows, batch[name].numpy()) for name in STEP_INPUTS}
        return arrays, int(batch["dropped_pairs"][0])

    @property
    def step(self):
        return int(self.state[2][self._iterations])

    def agree(self, value):
        if self.num_processes == 1:
            return value
        with self._collective("the broadcast of process 0's training time"):
            return float(multihost_utils.broadcast_one_to_all(np.float32(value)))

    @contextlib.contextmanager
    def _collective(self, what):
        """Runs `what`, work with the other processes: an error that says a peer is gone raises
        `LostProcess` (which `training.train` turns into one clear message)."""
        try:
            yield
        except jax.errors.JaxRuntimeError as error:
            if self.num_processes == 1 or not PEER_LOST.search(str(error)):
                raise
            detail = str(error).strip().splitlines()[0]
            raise LostProcess(what, detail, self.process_index, self.num_processes) from error

    # Checkpoints.

    def _data_prefix(self, folder):
        """Where this process keeps its data position in a checkpoint folder."""
        return os.path.join(folder, "data" if self.process_index == 0 else f"data-{self.process_index}")

    def _barrier(self, name):
        if self.num_processes > 1:
            with self._collective(f"the barrier '{name}'"):
                multihost_utils.sync_global_devices(name)

    def restore(self, run, iterator, keep):
        self.run, self.keep = run, keep
        self.checkpoint = tf.train.Checkpoint(data=iterator)
        complete = run.checkpoints()
        if self.is_chief:  # saves that a crash interrupted: folders without their state.json
            names = tf.io.gfile.listdir(run.checkpoint_dir) if tf.io.gfile.isdir(run.checkpoint_dir) else []
            for name in names:
                path = os.path.join(run.checkpoint_dir, name.rstrip("/"))
                if name.startswith(("ckpt-", ".ckpt-")) and path not in [p for _, p in complete]:
                    remove_tree(path)
        self._barrier("restore")  # every process has listed the checkpoints before any writes
        if not complete:
            return None, 0.0
        _, path = complete[-1]
        with tf.io.gfile.GFile(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        load_weights(self.model, path)
        with local_copy(os.path.join(path, "training_state.npz")) as local, np.load(local) as saved:
            for prefix, variables in (("non_trainable", self.model.non_trainable_variables),
                                      ("optimizer", self.optimizer.variables)):  # fmt: skip
                for index, variable in enumerate(variables):
                    value = saved[f"{prefix}/{index}"]
                    if tuple(value.shape) != tuple(variable.shape):
                        raise ValueError(f"{path}: {variable.path} has shape {value.shape}, the model {variable.shape}.")
                    variable.assign(value)
        self.checkpoint.read(self._data_prefix(path)).assert_consumed()
        self.state = self._state_from_variables()
        return path, state["train_seconds"]

    def save(self, step, train_seconds):
        run = self.run
        folder = os.path.join(run.checkpoint_dir, checkpoint_name(step))
        if self.is_chief:  # the one process that writes the replicated state copies it to the host
            self.sync_model()
            remove_tree(folder)  # the same step saved again (a rerun): it is complete only at the end
            tf.io.gfile.makedirs(folder)
            with written_locally(os.path.join(folder, "model.weights.h5")) as local:
                self.model.save_weights(local)
            arrays = {f"non_trainable/{i}": np.asarray(v) for i, v in enumerate(self.state[1])}
            arrays.update({f"optimizer/{i}": np.asarray(v) for i, v in enumerate(self.state[2])})
            with written_locally(os.path.join(folder, "training_state.npz")) as local:
                np.savez(local, **arrays)
        self._barrier(f"save {step}: folder made")
        self.checkpoint.write(self._data_prefix(folder))
        self._barrier(f"save {step}: written")
        if self.is_chief:  # state.json last, whole or not at all: it marks the checkpoint complete
            run.write_json(os.path.join(folder, "state.json"), {"step": step, "train_seconds": train_seconds, "backend": self.name})
            for _, old in run.checkpoints()[: -self.keep]:
                remove_tree(old)
        self._barrier(f"save {step}: done")
        return folder
