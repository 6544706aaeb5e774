"""`python -m training.average_checkpoints --run-dir DIR [--last 5]`: average the model weights of
the last checkpoints (the paper averages the last 5 for base models, the last 20 for big ones).

Writes DIR/averaged/, which training.evaluate and export then use instead of the latest checkpoint.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from training.run_folder import RunFolder  # noqa: E402


def average_checkpoints(run_dir, last=5):
    """Averages the last `last` checkpoints of a run; returns the averaged checkpoint's path."""
    run = RunFolder(run_dir)
    state = tf.train.get_checkpoint_state(run.checkpoint_dir)
    paths = list(state.all_model_checkpoint_paths)[-last:] if state else []
    if not paths:
        raise ValueError(f"{run.checkpoint_dir} holds no checkpoint to average.")
    model = Transformer(run.config())
    checkpoint = tf.train.Checkpoint(model=model)
    total = None
    for path in paths:
        checkpoint.restore(path).expect_partial()
        weights = model.get_weights()
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    model.set_weights([t / len(paths) for t in total])
    step = int(paths[-1].rsplit("-", 1)[-1])
    manager = tf.train.CheckpointManager(checkpoint, run.averaged_dir, max_to_keep=1)
    saved = manager.save(checkpoint_number=step)
    run.update_metrics({"averaged_checkpoints": [os.path.basename(p) for p in paths]})
    return saved, paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--last", type=int, default=5, help="how many of the latest checkpoints to average")
    args = parser.parse_args(argv)
    try:
        saved, paths = average_checkpoints(args.run_dir, args.last)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"Averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)}) into {saved}.")


if __name__ == "__main__":
    main()
