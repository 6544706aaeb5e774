"""Training speed: target tokens per second of the product's own training step (forward,
backward and Adam update, through `training.backends`) under TensorFlow without and with XLA and
under JAX, next to PyTorch's `nn.Transformer` of the same shape (bench/torch_reference.py, when
PyTorch is installed) and to the GFLOP/s of a large float32 matmul, all measured in the same run.

    python -m bench.train_throughput           # small (d_model 256, 3+3 layers, vocab 8000) and base
    python -m bench.train_throughput --configs small --backends jax,torch

Batches of 64 pairs of 32 + 32 random tokens; `fraction_of_matmul` is the step's GFLOP/s (matmuls
counted from the config, backward = 2x forward) over the matmul's. A process a row.
"""

import argparse
import sys

import keras
import numpy as np
import tensorflow as tf

from bench import torch_reference
from bench.common import emit, peak_rss_mb, run_isolated, time_call
from keras_transformer import TransformerConfig
from keras_transformer.search.flags import flag_of
from training import backends
from training.schedule import TransformerSchedule, paper_optimizer

# The rows of a run: (backend, XLA) in the order measured.
ROWS = {"tensorflow": [("tensorflow", False), ("tensorflow", True)], "jax": [("jax", True)], "torch": [("torch", False)]}


def make_config(name, vocab_size):
    """A preset (`small`, `base`), or "smoke": a one-layer model for the smoke mode."""
    if name == "smoke":
        return TransformerConfig.tiny(vocab_size, num_layers=1, d_model=32, num_heads=2, d_ff=64)
    return TransformerConfig.preset(name, vocab_size)


def matmul_gflops(size, repeats):
    """GFLOP/s of a float32 [size, size] x [size, size] matmul, compiled with XLA."""
    a = tf.random.normal([size, size])
    b = tf.random.normal([size, size])
    matmul = tf.function(lambda x, y: tf.reduce_sum(x @ y), jit_compile=True)
    seconds = time_call(lambda: matmul(a, b).numpy(), repeats)
    return 2 * size**3 / seconds / 1e9


def training_flops(config, batch, source_len, target_len):
    """Matmul FLOPs of one training step (forward x 3: the backward pass costs about twice)."""
    d, d_ff, vocab = config.d_model, config.d_ff, config.vocab_size
    encoder = source_len * (4 * d * d + 2 * d * d_ff) * 2 + 2 * source_len * source_len * d * 2
    decoder = (
        target_len * (4 * d * d + 2 * d * d + 2 * d * d_ff) * 2  # self-attention, cross Q/O, FFN
        + source_len * 2 * d * d * 2  # cross-attention K/V of the encoder output
        + 2 * target_len * target_len * d * 2  # self-attention scores and mix
        + 2 * target_len * source_len * d * 2  # cross-attention scores and mix
    )
    logits = target_len * d * vocab * 2
    return 3 * batch * (config.encoder_layers * encoder + config.decoder_layers * decoder + logits)


def measure(name, backend_name, xla, args, ceiling):
    keras.utils.set_random_seed(0)
    config = make_config(name, args.vocab_size)
    rng = np.random.default_rng(0)
    ids = lambda length: rng.integers(4, args.vocab_size, size=(args.batch, length), dtype=np.int32)  # noqa: E731
    batch = {
        "source": ids(args.length),
        "target_input": ids(args.length),
        "target_output": ids(args.length),
        "dropped_pairs": np.zeros([args.batch], np.int64),
    }
    if backend_name == "torch":
        seconds = torch_reference.step_seconds(config, batch["source"], batch["target_input"], batch["target_output"],
                                               args.steps, args.repeats)  # fmt: skip
        if seconds is None:
            print("PyTorch is not installed: no reference row (pip install torch).", file=sys.stderr)
            return
        parameters = None
    else:
        backend = backends.create("cpu")
        backend.build(config, lambda: paper_optimizer(TransformerSchedule(config.d_model)))
        backend.compile(label_smoothing=0.1, jit_compile=xla)
        iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
        seconds = time_call(lambda: backend.train_steps(iterator, args.steps), args.repeats) / args.steps
        parameters = backend.model.count_params()
    gflops = training_flops(config, args.batch, args.length, args.length) / seconds / 1e9
    emit({"benchmark": "train_throughput", "config": name, "backend": backend_name, "xla": xla, "batch": args.batch,
          "source_tokens": args.length, "target_tokens": args.length, "parameters": parameters,
          "step_seconds": round(seconds, 4), "tgt_tokens_per_s": round(args.batch * args.length / seconds, 1),
          "gflops_per_s": round(gflops, 1), "matmul_gflops_per_s": round(ceiling, 1),
          "fraction_of_matmul": round(gflops / ceiling, 3), "peak_rss_mb": round(peak_rss_mb(), 1)})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="small,base")
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--only", help="one measurement, CONFIG:BACKEND:XLA (e.g. small:jax:1), with --ceiling")
    parser.add_argument("--ceiling", type=float, help="matmul GFLOP/s measured by the parent run")
    args = parser.parse_args(argv)
    ceiling = args.ceiling or matmul_gflops(args.matmul_size, args.repeats)
    if args.only:
        name, backend, xla = args.only.split(":")
        measure(name, backend, bool(int(xla)), args, ceiling)
        return
    passed = [f"{flag_of(k)}={v}" for k, v in vars(args).items() if k not in ("only", "ceiling")]
    for name in args.configs.split(","):
        for backend in args.backends.split(","):
            for backend_name, xla in ROWS[backend]:
                env = {"KERAS_BACKEND": "jax" if backend_name == "jax" else "tensorflow"}
                run_isolated("bench.train_throughput", [*passed, f"--only={name}:{backend_name}:{int(xla)}",
                                                        f"--ceiling={ceiling}"], env)  # fmt: skip


if __name__ == "__main__":
    main()
