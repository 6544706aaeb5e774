"""`python -m training.average_checkpoints --run-dir DIR [--last 5]`: average the model weights of
the last checkpoints (the paper averages the last 5 for base models, the last 20 for big ones).

Works on the checkpoints of either backend. Writes DIR/averaged/ckpt-STEP.weights.h5 (Keras'
weights format) and DIR/averaged/averaged.json (the steps averaged). training.evaluate and export
use the average while it is newer than every training checkpoint.
"""

import argparse
import os

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from training.run_folder import RunFolder, checkpoint_name, load_weights, written_locally  # noqa: E402


def averaged_model(config, paths):
    """A Transformer of `config` with the mean of the weights of the checkpoints at `paths`."""
    model = Transformer(config)
    total = None
    for path in paths:
        load_weights(model, path)
        weights = model.get_weights()
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    model.set_weights([t / len(paths) for t in total])
    return model


def average_checkpoints(run_dir, last=5):
    """Averages the last `last` checkpoints of a run; returns (the averaged file, the paths)."""
    run = RunFolder(run_dir)
    checkpoints = run.checkpoints()[-last:]
    if not checkpoints:
        raise ValueError(f"{run.checkpoint_dir} holds no checkpoint to average.")
    model = averaged_model(run.config(), [path for _, path in checkpoints])
    steps = [step for step, _ in checkpoints]
    name = checkpoint_name(steps[-1]) + ".weights.h5"
    tf.io.gfile.makedirs(run.averaged_dir)
    saved = os.path.join(run.averaged_dir, name)
    with written_locally(saved) as local:
        model.save_weights(local)
    run.write_json(run.averaged_record_path, {"file": name, "steps": steps})
    for old in tf.io.gfile.listdir(run.averaged_dir):  # after the record names the new file
        if old.endswith(".weights.h5") and old != name:
            tf.io.gfile.remove(os.path.join(run.averaged_dir, old))
    paths = [path for _, path in checkpoints]
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
