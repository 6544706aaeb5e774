"""Choosing the tf.distribute strategy: TPU, several GPUs, several workers, or one device."""

import glob
import os

import tensorflow as tf

STRATEGIES = ("auto", "tpu", "mirrored", "multiworker", "cpu")


def tpu_attached():
    """A TPU VM exposes its chips as /dev/accel* (or /dev/vfio); older Colab TPUs set an address."""
    return bool(glob.glob("/dev/accel*") or os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_NAME"))


def make_strategy(name="auto"):
    """The strategy for `--strategy NAME`.

    auto: TPUStrategy when a TPU is attached, MirroredStrategy on several GPUs, else the default
    strategy. tpu: Colab's TPU VMs need `TPUClusterResolver(tpu="local")`; the older Colab TPU
    nodes and Cloud TPUs give an address in COLAB_TPU_ADDR / TPU_NAME. multiworker: reads
    TF_CONFIG. cpu: the default strategy on the CPU, even where accelerators exist.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown --strategy {name!r}: choose one of {', '.join(STRATEGIES)}.")
    if name == "auto":
        if tpu_attached():
            name = "tpu"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            return tf.distribute.get_strategy()
    if name == "tpu":
        address = os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR")
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=f"grpc://{address}" if address and ":" in address else (address or "local")
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("--strategy multiworker needs the TF_CONFIG environment variable (cluster and task).")
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def local_replicas(strategy):
    """The replicas of `strategy` on this worker's devices."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return len(strategy.extended.worker_devices)
    return strategy.num_replicas_in_sync


def worker_index(strategy):
    """This worker's index among the workers of a multi-worker strategy (0 for the others)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver.task_type == "chief":
        return 0
    # With a task of type "chief" in the cluster, it is worker 0 and the workers come after it.
    return (resolver.task_id or 0) + ("chief" in resolver.cluster_spec().as_dict())


def is_chief(strategy):
    """Whether this worker writes checkpoints, logs and metrics (worker 0, or the only one)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    return resolver.task_type in (None, "chief") or (resolver.task_type == "worker" and resolver.task_id == 0)
