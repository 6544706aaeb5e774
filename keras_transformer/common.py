"""What several modules share: the special token ids, and a fresh copy of an initializer."""

# The special ids every tokenizer of this project uses (training/tokenizer.py trains to them).
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# The logit or score of what must never be chosen: a masked position, padding, a dead hypothesis.
NEG_INF = -1e9


def fresh_initializer(initializer):
    """A new instance of `initializer`: one Keras initializer instance without a seed gives the
    same values at every call, so each weight needs its own."""
    return initializer.__class__.from_config(initializer.get_config())
