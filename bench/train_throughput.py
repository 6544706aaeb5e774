"""Training speed: target tokens per second of the compiled training step (forward, backward and
Adam update: `training.backends.tensorflow.Trainer`, the product's own step), with and without XLA, next to the
GFLOP/s of a large float32 matmul measured in the same run.

    python -m bench.train_throughput           # small (d_model 256, 3+3 layers, vocab 8000) and base
    python -m bench.train_throughput --smoke   # seconds-long, tiny sizes (the test suite runs this)

Batch: 64 pairs of 32 source + 32 target tokens, random ids, dropout as configured. FLOPs per
step are counted from the config (matmuls only, backward = 2x forward); `fraction_of_matmul`
is the training step's GFLOP/s over the matmul's.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.common import emit, peak_rss_mb, run_isolated, time_call  # noqa: E402
from keras_transformer import Transformer, TransformerConfig  # noqa: E402
from training.backends.tensorflow import Trainer  # noqa: E402
from training.schedule import TransformerSchedule, paper_optimizer  # noqa: E402


def make_config(name, vocab_size):
    """The `small` or `base` preset, or a one-layer model for the smoke run."""
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
    return 3 * batch * (config.num_layers * (encoder + decoder) + logits)


def measure(name, xla, args, ceiling):
    keras.utils.set_random_seed(0)
    config = make_config(name, args.vocab_size)
    model = Transformer(config)
    optimizer = paper_optimizer(TransformerSchedule(config.d_model))
    optimizer.build(model.trainable_variables)
    trainer = Trainer(model, optimizer, tf.distribute.get_strategy(), jit_compile=xla)
    rng = np.random.default_rng(0)
    ids = lambda length: rng.integers(4, args.vocab_size, size=(args.batch, length), dtype=np.int32)  # noqa: E731
    batch = {
        "source": ids(args.length),
        "target_input": ids(args.length),
        "target_output": ids(args.length),
        "batch_tokens": np.full([args.batch], args.batch * args.length, np.int32),
        "dropped_pairs": np.zeros([args.batch], np.int64),
    }
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    steps = tf.constant(args.steps)
    seconds = time_call(lambda: float(trainer.train_steps(iterator, steps)[0]), args.repeats) / args.steps
    gflops = training_flops(config, args.batch, args.length, args.length) / seconds / 1e9
    emit(
        {
            "benchmark": "train_throughput",
            "config": name,
            "xla": xla,
            "batch": args.batch,
            "source_tokens": args.length,
            "target_tokens": args.length,
            "parameters": model.count_params(),
            "step_seconds": round(seconds, 4),
            "tgt_tokens_per_s": round(args.batch * args.length / seconds, 1),
            "gflops_per_s": round(gflops, 1),
            "matmul_gflops_per_s": round(ceiling, 1),
            "fraction_of_matmul": round(gflops / ceiling, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, in one process")
    parser.add_argument("--configs", default="small,base")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--only", help="one measurement, CONFIG:XLA (e.g. small:1), with --ceiling")
    parser.add_argument("--ceiling", type=float, help="matmul GFLOP/s measured by the parent run")
    args = parser.parse_args()
    if args.smoke:
        args.configs, args.batch, args.length, args.vocab_size, args.steps, args.repeats, args.matmul_size = "smoke", 4, 8, 50, 2, 1, 256
    ceiling = args.ceiling or matmul_gflops(args.matmul_size, args.repeats)
    if args.only:
        name, xla = args.only.split(":")
        measure(name, bool(int(xla)), args, ceiling)
        return
    for name in args.configs.split(","):
        for xla in (False, True):
            if args.smoke:
                measure(name, xla, args, ceiling)
            else:
                passed = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("smoke", "only", "ceiling")]
                run_isolated("bench.train_throughput", [*passed, f"--only={name}:{int(xla)}", f"--ceiling={ceiling}"])


if __name__ == "__main__":
    main()
