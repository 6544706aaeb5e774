"""`python -m training.train --run-dir DIR`: train a Transformer, then evaluate it.

With only --run-dir: the tiny config on the built-in synthetic corpus, then beam search on its
test split and DIR/metrics.json. Rerun with the same --run-dir to resume from the last checkpoint
(model, optimizer, step and the position in the data).

    python -m training.train --run-dir runs/wmt --config base --dataset tfds:wmt14_translate/de-en \\
        --source-lang en --target-lang de --strategy auto --mixed-precision
    python -m training.train --run-dir runs/multi30k --dataset ../shared/data/multi30k \\
        --source-lang en --target-lang de --dev-split val --test-split test2016
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer, TransformerConfig  # noqa: E402
from training import data, evaluate, strategy as strategies  # noqa: E402
from training.loss import smoothed_cross_entropy  # noqa: E402
from training.run_folder import RunFolder  # noqa: E402
from training.schedule import paper_optimizer  # noqa: E402
from training.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402

# Training settings per model preset: the paper's for base and big (section 5, Table 3); for tiny,
# what trains the synthetic corpus to BLEU > 90 in minutes on a 2-core CPU; for small, the
# Multi30k recipe of bench/multi30k.py (about 2 hours on a 2-core CPU).
PRESETS = {
    "tiny": dict(steps=600, batch_tokens=3072, warmup_steps=400, learning_rate_scale=2.0, vocab_size=4000,
                 max_length=64, checkpoint_every=200),
    "small": dict(steps=20_000, batch_tokens=3072, warmup_steps=1000, learning_rate_scale=1.0, vocab_size=8000,
                  max_length=128, checkpoint_every=200),
    "base": dict(steps=100_000, batch_tokens=25_000, warmup_steps=4000, learning_rate_scale=1.0, vocab_size=37_000,
                 max_length=256, checkpoint_every=2000),
    "big": dict(steps=300_000, batch_tokens=25_000, warmup_steps=4000, learning_rate_scale=1.0, vocab_size=37_000,
                max_length=256, checkpoint_every=2000),
}  # fmt: skip


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--run-dir", required=True, help="where the tokenizer, checkpoints, logs and metrics go")
    add("--config", default="tiny", help="model size: tiny, small, base or big (paper Table 3)")
    add("--dataset", default="synthetic", help="synthetic, tfds:NAME, or a folder of text files")
    add("--source-lang", help="source language (file suffix, or TFDS feature name)")
    add("--target-lang", help="target language")
    add("--dev-split", default="dev", help="file prefix of the dev split of a folder (Multi30k: val)")
    add("--test-split", default="test", help="file prefix of the test split of a folder (Multi30k: test2016)")
    add("--data-dir", help="TFDS data_dir (a GCS bucket on a TPU)")
    add("--steps", type=int, help="total training steps (tiny: 600, base: 100k, big: 300k)")
    add("--max-minutes", type=float, help="stop (with a checkpoint) once training has taken this long, resumes included")
    add("--batch-tokens", type=int, help="source (and target) tokens per batch (paper: 25000)")
    add("--warmup-steps", type=int, help="section 5.3 warm-up (paper: 4000)")
    add("--learning-rate-scale", type=float, help="a factor on the section 5.3 learning rate (paper: 1)")
    add("--label-smoothing", type=float, default=0.1)
    add("--dropout", type=float, help="override the config's P_drop")
    add("--vocab-size", type=int, help="SentencePiece vocabulary, an upper bound (paper: 37000)")
    add("--max-length", type=int, help="longest sentence in tokens; longer training pairs are dropped")
    add("--steps-per-call", type=int, default=50, help="training steps per host call (one compiled loop)")
    add("--checkpoint-every", type=int, help="steps between checkpoints")
    add("--keep-checkpoints", type=int, default=5, help="checkpoints kept (the paper averages the last 5)")
    add("--eval-every", type=int, default=0, help="steps between dev BLEU evaluations (0: at the end only)")
    add("--eval-sentences", type=int, default=500, help="dev sentences for BLEU during training")
    add("--beam-size", type=int, default=4)
    add("--alpha", type=float, default=0.6)
    add("--strategy", default="auto", help="auto, tpu, mirrored, multiworker or cpu")
    add("--mixed-precision", action="store_true", help="bfloat16 on TPU and CPU, float16 with loss scaling on GPU")
    add("--no-xla", action="store_true", help="run the step without XLA (for comparison)")
    add("--no-evaluate", action="store_true", help="skip the test evaluation at the end")
    add("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.config not in PRESETS:
        parser.error(f"--config {args.config!r}: choose {', '.join(PRESETS)}")
    for name, value in PRESETS[args.config].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    positive = ("steps", "batch_tokens", "warmup_steps", "vocab_size", "max_length", "steps_per_call", "checkpoint_every",
                "max_minutes")  # fmt: skip
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def get_tokenizer(run, corpus, vocab_size, is_chief, max_pairs=1_000_000):
    """The run's tokenizer: loaded if the run folder has one, else trained on the training split."""
    if not os.path.exists(run.tokenizer_path):
        print(f"Training a SentencePiece tokenizer ({vocab_size} pieces at most) on {corpus.name}...", flush=True)
        pairs = corpus.text_pairs("train", max_pairs)
        tokenizer = Tokenizer(train_sentencepiece([text for pair in pairs for text in pair], vocab_size))
        if is_chief:
            os.makedirs(run.path, exist_ok=True)
            tokenizer.save(run.tokenizer_path + ".tmp")
            os.replace(run.tokenizer_path + ".tmp", run.tokenizer_path)
        return tokenizer
    return run.load_tokenizer()


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


def _step(optimizer):
    return int(keras.ops.convert_to_numpy(optimizer.iterations))  # also for a MirroredVariable


def _rows_of_replica(batch, context):
    """The slice of a global batch that one replica trains on."""
    rows = tf.shape(batch["source"])[0] // context.num_replicas_in_sync
    start = rows * context.replica_id_in_sync_group
    return {name: value[start : start + rows] for name, value in batch.items()}


def train(args, strategy=None):
    """Trains (or resumes) the run of `args` (from `parse_args`); returns (model, metrics).
    `strategy` overrides `--strategy`, for callers that connected to their devices already."""
    strategy = strategy or strategies.make_strategy(args.strategy)
    is_chief = strategies.is_chief(strategy)
    if args.max_minutes is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Each worker has its own clock: one could stop a step before the others, which would wait forever.
        raise ValueError("--max-minutes cannot be used with several workers: give --steps instead.")
    if args.mixed_precision:
        on_gpu = bool(tf.config.list_logical_devices("GPU")) and not isinstance(strategy, tf.distribute.TPUStrategy)
        keras.mixed_precision.set_global_policy("mixed_float16" if on_gpu else "mixed_bfloat16")
    keras.utils.set_random_seed(args.seed)

    run = RunFolder(args.run_dir)
    corpus = data.load_corpus(args.dataset, args.source_lang, args.target_lang, args.dev_split, args.test_split,
                              args.data_dir, args.seed)  # fmt: skip
    tokenizer = get_tokenizer(run, corpus, args.vocab_size, is_chief)
    overrides = {"max_length": args.max_length, **({"dropout": args.dropout} if args.dropout is not None else {})}
    config = TransformerConfig.preset(args.config, tokenizer.vocab_size, **overrides)
    settings = {name: getattr(args, name) for name in vars(args)}
    settings.update(dataset=args.dataset, source_lang=corpus.source_lang, target_lang=corpus.target_lang)
    if is_chief:
        run.check_or_write(config, settings)

    with strategy.scope():
        model = Transformer(config)
        optimizer = paper_optimizer(config.d_model, args.warmup_steps, args.learning_rate_scale)
        if keras.mixed_precision.global_policy().name == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    train_seconds = tf.Variable(0.0, trainable=False, dtype=tf.float64)
    batches = data.training_batches(
        corpus, tokenizer, batch_tokens=args.batch_tokens, max_length=config.max_length,
        batch_multiple=strategy.num_replicas_in_sync, seed=args.seed,
    )  # fmt: skip
    iterator = iter(batches)  # every worker reads the same global batches

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, data=iterator, train_seconds=train_seconds)
    # Every worker saves (saving is collective); only the chief's copy is kept.
    checkpoint_dir = run.checkpoint_dir if is_chief else tempfile.mkdtemp(prefix="worker-checkpoints-")
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=args.keep_checkpoints)
    latest = tf.train.latest_checkpoint(run.checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
        print(f"Resumed from {latest} at step {_step(optimizer)}.", flush=True)

    trainer = Trainer(model, optimizer, strategy, args.label_smoothing, jit_compile=not args.no_xla)
    writer = tf.summary.create_file_writer(os.path.join(run.log_dir, "train")) if is_chief else tf.summary.create_noop_writer()
    dev_writer = tf.summary.create_file_writer(os.path.join(run.log_dir, "dev")) if is_chief else tf.summary.create_noop_writer()
    progress = keras.utils.Progbar(args.steps, stateful_metrics=["loss", "lr", "tok/s"], unit_name="step")
    step, dropped = _step(optimizer), 0
    progress.update(step)
    out_of_time = lambda: args.max_minutes is not None and float(train_seconds) >= 60 * args.max_minutes  # noqa: E731
    while step < args.steps and not out_of_time():
        boundary = min(args.steps, (step // args.checkpoint_every + 1) * args.checkpoint_every)
        num_steps = min(args.steps_per_call, boundary - step)
        start = time.perf_counter()
        loss, tokens, dropped = trainer.train_steps(iterator, tf.constant(num_steps))
        loss, tokens, dropped = float(loss), float(tokens), int(dropped)  # waits for the steps to finish
        seconds = time.perf_counter() - start
        train_seconds.assign_add(seconds)
        step = _step(optimizer)
        learning_rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        progress.update(step, [("loss", loss), ("lr", learning_rate), ("tok/s", tokens / seconds)])
        with writer.as_default(step=step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", learning_rate)
            tf.summary.scalar("target_tokens_per_second", tokens / seconds)
            tf.summary.scalar("dropped_pairs", dropped)
        if step == boundary or out_of_time():
            manager.save(checkpoint_number=step)
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            _evaluate_dev(model, tokenizer, corpus, args, dev_writer, step)
    if step < args.steps:
        print(f"Stopped at step {step} of {args.steps}: --max-minutes {args.max_minutes} reached.", flush=True)
    if dropped:
        print(f"{dropped} training pairs longer than --max-length {config.max_length} were dropped.", flush=True)
    if not is_chief:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        return model, None

    metrics = {"steps": step, "train_seconds": round(float(train_seconds), 1), "dropped_pairs": dropped}
    if not args.no_evaluate:
        if corpus.text_pairs("dev", 1):
            metrics["dev_bleu"] = _evaluate_dev(model, tokenizer, corpus, args, dev_writer, step)
        metrics.update(evaluate.evaluate(
            model, tokenizer, corpus, "test", beam_size=args.beam_size, alpha=args.alpha,
            output_path=os.path.join(run.path, "translations.test.txt"),
        ))  # fmt: skip
        metrics["checkpoint"] = manager.latest_checkpoint
        print(f"Test BLEU {metrics['bleu']} (chrF {metrics['chrf']}) on {metrics['sentences']} sentences; "
              f"{metrics['signature']}", flush=True)  # fmt: skip
    run.update_metrics(metrics)
    return model, metrics


def _evaluate_dev(model, tokenizer, corpus, args, writer, step):
    metrics = evaluate.evaluate(model, tokenizer, corpus, "dev", beam_size=args.beam_size, alpha=args.alpha,
                                limit=args.eval_sentences)  # fmt: skip
    with writer.as_default(step=step):
        tf.summary.scalar("bleu", metrics["bleu"])
        tf.summary.scalar("chrf", metrics["chrf"])
    print(f"step {step}: dev BLEU {metrics['bleu']} (chrF {metrics['chrf']})", flush=True)
    return metrics["bleu"]


def main(argv=None):
    args = parse_args(argv)
    try:
        train(args)
    except ValueError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
