"""One process of a multi-process training test (TensorFlow's TF_CONFIG workers, JAX's
processes): trains through training.train with the remaining flags, then

    --weights-out PATH      saves its final weights to PATH (.npz)
    --shards-written PATH   writes the numbers of the tokenized shards this process wrote (JSON)
"""

import json
import sys

import numpy as np

from training import shards
from training.train import parse_args, train


def _take(argv, flag):
    """The value of `flag` in `argv`, removed from it (None if absent)."""
    if flag not in argv:
        return None
    index = argv.index(flag)
    value = argv[index + 1]
    del argv[index : index + 2]
    return value


if __name__ == "__main__":
    argv = sys.argv[1:]
    weights_out, shards_out = _take(argv, "--weights-out"), _take(argv, "--shards-written")
    written, write = [], shards.TokenizedShards._write

    def recorded(self, shard, *args):
        result = write(self, shard, *args)
        written.append(shard)
        return result

    shards.TokenizedShards._write = recorded
    model, _ = train(parse_args(argv))
    if weights_out:
        np.savez(weights_out, *model.get_weights())
    if shards_out:
        with open(shards_out, "w") as f:
            json.dump(sorted(written), f)
