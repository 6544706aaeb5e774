"""One worker of test_train_end_to_end's multi-worker test: trains through training.train with
TF_CONFIG from the environment, then saves its final weights to --weights-out."""

import sys

import numpy as np

from training.train import parse_args, train

if __name__ == "__main__":
    argv = sys.argv[1:]
    weights_out = argv[argv.index("--weights-out") + 1]
    del argv[argv.index("--weights-out") : argv.index("--weights-out") + 2]
    model, _ = train(parse_args(argv))
    np.savez(weights_out, *model.get_weights())
