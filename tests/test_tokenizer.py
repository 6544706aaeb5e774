import numpy as np
import tensorflow as tf

from keras_transformer import EOS_ID


def test_encode_source_cuts_ends_with_eos_and_pads(synthetic_tokenizer):
    sentences = ["The dog helps the man.", "Yesterday the small dog saw the red car in the park.", ""]
    pieces = [list(row) for row in synthetic_tokenizer.source.tokenize(tf.constant(sentences)).to_list()]
    assert len(pieces[1]) > 6 and pieces[2] == []

    uncut = synthetic_tokenizer.encode_source(tf.constant(sentences)).to_list()
    assert uncut == [row + [EOS_ID] for row in pieces]
    cut = synthetic_tokenizer.encode_source(tf.constant(sentences), max_length=6)
    assert cut.to_list() == [row[:5] + [EOS_ID] for row in pieces]
    padded = cut.to_tensor().numpy()
    assert padded.shape == (3, 6) and padded.dtype == np.int32
    np.testing.assert_array_equal(padded[2], [EOS_ID, 0, 0, 0, 0, 0])

    # A scalar, as the tf.data pipeline maps one sentence at a time.
    single = synthetic_tokenizer.encode_source(tf.constant(sentences[1]), max_length=6)
    assert single.numpy().tolist() == pieces[1][:5] + [EOS_ID]
