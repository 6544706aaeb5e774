"""One process of a multi-process training test (TensorFlow's TF_CONFIG workers, JAX's
processes): trains through training.train with the remaining flags, then

    --weights-out PATH      saves its final weights to PATH (.npz)
    --shards-written PATH   writes the numbers of the tokenized shards this process wrote (JSON)
"""

import argparse
import json

import numpy as np

from training.tokenized import TokenizedShards
from training.train import parse_args, train

if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)  # the rest are training.train's flags
    parser.add_argument("--weights-out")
    parser.add_argument("--shards-written")
    ours, argv = parser.parse_known_args()
    written, write = [], TokenizedShards._write

    def recorded(self, shard, *args):
        result = write(self, shard, *args)
        written.append(shard)
        return result

    TokenizedShards._write = recorded
    model, _ = train(parse_args(argv))
    if ours.weights_out:
        np.savez(ours.weights_out, *model.get_weights())
    if ours.shards_written:
        with open(ours.shards_written, "w") as f:
            json.dump(sorted(written), f)
