"""`python -m training.learning_curve --run-dir DIR`: plot a run's learning curve from its
TensorBoard logs, training loss and dev BLEU against training minutes, into
`DIR/learning_curve.png`.

Dev BLEU has points where training evaluated it: every `--eval-every-minutes` (or
`--eval-every` steps) and at the end. Minutes are the training clock that `--max-minutes`
budgets, resumed runs included, without the evaluations' own time.
"""

import argparse
import os
import sys

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from training.run_folder import RunFolder  # noqa: E402


def read_scalars(log_dir):
    """`{tag: {step: value}}` from the event files under `log_dir` (one writer's folder); where
    a resumed run logged a step again, the later value."""
    events = []
    for path in sorted(tf.io.gfile.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
        events += list(tf.compat.v1.train.summary_iterator(path))
    scalars = {}
    for event in sorted(events, key=lambda event: event.wall_time):
        for value in event.summary.value:
            scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def curve(run_dir):
    """The points of the curve: `(loss_minutes, loss, bleu_minutes, bleu)`, numpy arrays."""
    logs = RunFolder(run_dir).log_dir
    train = read_scalars(os.path.join(logs, "train"))
    if "training_minutes" not in train:
        raise ValueError(f"{logs}/train has no training_minutes: is {run_dir} a run folder of training.train?")
    steps = np.array(sorted(train["training_minutes"]))
    minutes = np.array([train["training_minutes"][step] for step in steps])
    loss = np.array([train["loss"][step] for step in steps])
    dev = read_scalars(os.path.join(logs, "dev")).get("bleu", {})
    dev_steps = np.array(sorted(dev), dtype=float)
    bleu = np.array([dev[step] for step in sorted(dev)])
    return minutes, loss, np.interp(dev_steps, steps, minutes), bleu


def plot(run_dir, output_path=None, title=None):
    """Writes the learning curve PNG (default `run_dir/learning_curve.png`); returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # no screen needed
    from matplotlib import pyplot

    loss_minutes, loss, bleu_minutes, bleu = curve(run_dir)
    figure, loss_axis = pyplot.subplots(figsize=(7, 4), dpi=110)
    loss_axis.plot(loss_minutes, loss, color="tab:blue", linewidth=1)
    loss_axis.set_xlabel("training minutes")
    loss_axis.set_ylabel("training loss (label-smoothed cross-entropy)", color="tab:blue")
    bleu_axis = loss_axis.twinx()
    bleu_axis.plot(bleu_minutes, bleu, color="tab:red", marker="o")
    bleu_axis.set_ylabel("dev BLEU (cased sacreBLEU)", color="tab:red")
    loss_axis.set_title(title or os.path.basename(str(run_dir).rstrip("/")))
    loss_axis.grid(alpha=0.3)
    figure.tight_layout()
    output_path = output_path or RunFolder(run_dir).learning_curve_path
    with tf.io.gfile.GFile(output_path, "wb") as f:
        figure.savefig(f, format="png")
    pyplot.close(figure)
    return output_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", help="the PNG's path (default: DIR/learning_curve.png)")
    args = parser.parse_args(argv)
    try:
        print(plot(args.run_dir, args.out))
    except ValueError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
