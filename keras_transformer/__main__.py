"""`python -m keras_transformer`: build a model and run one forward pass (a smoke check)."""

import argparse

import numpy as np

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.config import PRESETS


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="base", choices=list(PRESETS))
    parser.add_argument("--vocab-size", type=int, default=37000)
    args = parser.parse_args()
    model = Transformer(TransformerConfig.preset(args.config, args.vocab_size))
    rng = np.random.default_rng(0)
    source = rng.integers(1, args.vocab_size, size=(2, 12))
    target = rng.integers(1, args.vocab_size, size=(2, 9))
    logits = model((source, target))
    print(f"{args.config}: {model.count_params():,} parameters; logits {tuple(logits.shape)} {logits.dtype}")


if __name__ == "__main__":
    main()
