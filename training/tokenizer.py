"""One SentencePiece model shared by source and target (section 3.4 shares the vocabulary),
trained with `sentencepiece` and applied in-graph with `tensorflow_text`, so that the
tf.data pipeline and the exported SavedModel tokenize the same way.

Fixed ids: 0 padding, 1 unknown, 2 begin-of-sentence, 3 end-of-sentence (keras_transformer's
PAD_ID, UNK_ID, BOS_ID, EOS_ID).
"""

import io

import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def train_sentencepiece(sentences, vocab_size, model_type="bpe", symbols=()):
    """Trains a SentencePiece model on an iterable of strings (all of them: pass a sample of a
    large corpus, `shards.TextShards.sample`); returns the serialized model.

    The paper uses byte-pair encoding with a shared vocabulary of about 37,000 tokens.
    `vocab_size` is an upper bound: a small corpus may give fewer pieces. `symbols` are strings
    that are always one piece each (the target-language tags of training/languages.py).
    """
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        character_coverage=1.0,
        hard_vocab_limit=False,
        user_defined_symbols=list(symbols),
        minloglevel=2,
    )
    return model.getvalue()


class Tokenizer(tf.Module):
    """Text <-> ids with one SentencePiece model, as TensorFlow ops.

    In eager mode, `tf.random.set_seed` (and so `keras.utils.set_random_seed`) clears the
    kernel that owns the SentencePiece resource: set seeds before making a Tokenizer.

    Args:
        model_proto: the serialized SentencePiece model (bytes).
    """

    def __init__(self, model_proto):
        super().__init__()
        self.model_proto = model_proto
        self.sentencepiece = tensorflow_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)

    @classmethod
    def load(cls, path):
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read())

    def save(self, path):
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(self.model_proto)

    @property
    def vocab_size(self):
        return int(self.sentencepiece.vocab_size())

    def tokenize(self, text):
        """String tensor `[batch]` (or a scalar) -> ragged int32 ids `[batch, None]` (or `[None]`)."""
        return self.sentencepiece.tokenize(text)

    def encode_source(self, text, max_length=None):
        """Source text -> the ids the model reads: the pieces, cut to leave room for the
        end-of-sentence id within `max_length` tokens (no cut if None), then that id.

        A string tensor `[batch]` gives ragged int32 `[batch, None]` (`.to_tensor()` pads with 0);
        a scalar gives `[None]`. Training, evaluation and the exported model all encode so.
        """
        ids = self.tokenize(text)
        if max_length is not None:
            ids = ids[..., : max_length - 1]
        if isinstance(ids, tf.RaggedTensor):
            return tf.concat([ids, tf.fill([ids.nrows(), 1], EOS_ID)], axis=1)
        return tf.concat([ids, [EOS_ID]], axis=0)

    def pieces(self, ids):
        """Int ids (any shape) -> their SentencePiece pieces as strings, "" for padding (0)."""
        return tf.where(ids == PAD_ID, "", self.sentencepiece.id_to_string(ids))

    def detokenize(self, ids):
        """Int ids `[batch, length]` padded with 0 (or ragged) -> strings `[batch]`."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids, padding=PAD_ID)
        return self.sentencepiece.detokenize(ids)
