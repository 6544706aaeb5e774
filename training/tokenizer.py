"""Text <-> ids with SentencePiece (section 3.4), trained with `sentencepiece` and applied in-graph
with `tensorflow_text`, so that the tf.data pipeline and the exported SavedModel tokenize the
same way.

    Vocabulary   one language side: a SentencePiece model, and for an imported model the pieces
                 of the model's vocabulary, which map the model's pieces to its ids
    Tokenizer    a run's two sides, `source` and `target`: one Vocabulary for both where the
                 vocabulary is shared (the paper's), two where each side has its own

Fixed ids: 0 padding, 1 unknown, 2 begin-of-sentence, 3 end-of-sentence (keras_transformer's
PAD_ID, UNK_ID, BOS_ID, EOS_ID).
"""

import hashlib
import io
import re

import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# The piece of an OPUS-MT model's vocabulary that asks for a target language, >>fra<<.
MARIAN_TAG = re.compile(r">>([^<>\s]+)<<")
# A text's leading tag, this project's (<2fra>, training/languages.py) or OPUS-MT's, and its space.
_LEADING_TAG = r"^(?:<2([^<>\s]+)>|>>([^<>\s]+)<<)"


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


class Vocabulary(tf.Module):
    """One side's text <-> ids, as TensorFlow ops.

    In eager mode, `tf.random.set_seed` (and so `keras.utils.set_random_seed`) clears the
    kernel that owns the SentencePiece resource: set seeds before making a Vocabulary.

    Args:
        model_proto: the serialized SentencePiece model (bytes).
        pieces: None where the model's ids are SentencePiece's (a model of `train_sentencepiece`);
            else the piece of each of the model's ids (an imported model: training/marian.py),
            through which text and ids are mapped in the graph as Marian reads and writes them:
            text is cut into SentencePiece's pieces (an unknown one as its own text), each the
            id of its piece in `pieces` (none: unknown, 1); ids are written as their pieces,
            which SentencePiece joins into text (one it lacks as its unknown, where Marian
            writes the piece's own text: `tensorflow_text` joins ids, not pieces).
        tags: for a source with `pieces` that hold OPUS-MT's target-language pieces (`>>fra<<`):
            whether a text's leading tag, `<2fra>` as training/languages.py writes it or
            `>>fra<<` as OPUS-MT's users do, is that piece's id, not text (`language_tags`).
    """

    def __init__(self, model_proto, pieces=None, tags=False):
        super().__init__()
        self.model_proto = model_proto
        out_type = tf.int32 if pieces is None else tf.string
        # Named by its model: a SavedModel's loader makes each model's resource under its op's name,
        # so two models of one name (a source's and a target's) would both read the first.
        name = f"sentencepiece_{hashlib.sha256(model_proto).hexdigest()[:16]}"
        self.sentencepiece = tensorflow_text.SentencepieceTokenizer(model=model_proto, out_type=out_type, name=name)
        self.mapped_pieces = None if pieces is None else list(pieces)
        if pieces is not None:
            first = {}  # a piece twice in the vocabulary is read as its first id, as Marian reads it
            for i, piece in enumerate(pieces):
                if i not in (PAD_ID, BOS_ID):  # rows of our layout, never a piece of the text
                    first.setdefault(piece, i)
            initializer = tf.lookup.KeyValueTensorInitializer(tf.constant(list(first)), tf.constant(list(first.values())))
            self._ids_of_pieces = tf.lookup.StaticHashTable(initializer, default_value=UNK_ID)
            self._pieces_of_ids = tf.constant(self.mapped_pieces)
        tagged = pieces if tags and pieces is not None else ()
        self.language_tags = tuple(m.group(1) for piece in tagged if (m := MARIAN_TAG.fullmatch(piece)))

    @classmethod
    def load(cls, path, pieces=None, tags=False):
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read(), pieces, tags)

    def save(self, path):
        """Writes the SentencePiece model (`pieces`, if any, are the run folder's to write)."""
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(self.model_proto)

    @property
    def vocab_size(self):
        return len(self.mapped_pieces) if self.mapped_pieces is not None else int(self.sentencepiece.vocab_size())

    def piece_list(self):
        """The piece of each id, in id order (Python strings)."""
        if self.mapped_pieces is not None:
            return list(self.mapped_pieces)
        return [piece.decode() for piece in self.sentencepiece.id_to_string(tf.range(self.vocab_size)).numpy()]

    def tokenize(self, text):
        """String tensor `[batch]` (or a scalar) -> ragged int32 ids `[batch, None]` (or `[None]`)."""
        if self.language_tags:
            return self._tokenize_tagged(text)
        tokens = self.sentencepiece.tokenize(text)  # ids, or pieces for a vocabulary of `pieces`
        if self.mapped_pieces is None:
            return tokens
        if isinstance(tokens, tf.RaggedTensor):
            return tf.ragged.map_flat_values(self._ids_of_pieces.lookup, tokens)
        return self._ids_of_pieces.lookup(tokens)

    def _tokenize_tagged(self, text):
        """`tokenize` where a leading tag is one id (`language_tags`), the rest SentencePiece's."""
        text = tf.convert_to_tensor(text, tf.string)
        batch = tf.reshape(text, [-1])
        has_tag = tf.strings.regex_full_match(batch, _LEADING_TAG + r"( (?s:.*))?")
        tag = tf.strings.regex_replace(batch, _LEADING_TAG + r"(?s:.*)$", r">>\1\2<<")
        rest = tf.where(has_tag, tf.strings.regex_replace(batch, _LEADING_TAG + " ?", ""), batch)
        tags = tf.RaggedTensor.from_row_lengths(self._ids_of_pieces.lookup(tf.boolean_mask(tag, has_tag)),
                                                tf.cast(has_tag, tf.int64))  # fmt: skip
        pieces = tf.ragged.map_flat_values(self._ids_of_pieces.lookup, self.sentencepiece.tokenize(rest))
        ids = tf.concat([tf.cast(tags, tf.int32), pieces], axis=1)
        return ids[0] if text.shape.rank == 0 else ids

    def encode(self, text, max_length=None):
        """Text -> its pieces, cut to leave room for the end-of-sentence id within `max_length`
        tokens (no cut if None), then that id.

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
        """Int ids (any shape) -> their pieces as strings, "" for padding (0)."""
        pieces = self.sentencepiece.id_to_string(ids) if self.mapped_pieces is None else tf.gather(self._pieces_of_ids, ids)
        return tf.where(ids == PAD_ID, "", pieces)

    def detokenize(self, ids):
        """Int ids `[batch, length]` padded with 0 (or ragged) -> strings `[batch]`."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids, padding=PAD_ID)
        if self.mapped_pieces is not None:  # SentencePiece's ids of their pieces
            ids = tf.ragged.map_flat_values(lambda values: self.sentencepiece.string_to_id(tf.gather(self._pieces_of_ids, values)), ids)
        return self.sentencepiece.detokenize(ids)

    def digest(self):
        """A hash of what decides the ids: the model, and the pieces if any."""
        hashed = hashlib.sha256(self.model_proto)
        if self.mapped_pieces is not None:
            hashed.update("\n".join(self.mapped_pieces).encode())
        return hashed.hexdigest()


class Tokenizer(tf.Module):
    """A run's text <-> ids: `source` and `target`, each a `Vocabulary`, one object for both
    where the vocabulary is shared (section 3.4).

    Args:
        source: the source's `Vocabulary`, or a serialized SentencePiece model (bytes).
        target: the target's, as `source`; None: the source's (a shared vocabulary).
    """

    def __init__(self, source, target=None):
        super().__init__()
        self.source = source if isinstance(source, Vocabulary) else Vocabulary(source)
        self.target = self.source if target is None else target if isinstance(target, Vocabulary) else Vocabulary(target)

    @property
    def shared(self):
        """Whether both sides are one SentencePiece model."""
        return self.target is self.source

    @property
    def one_vocabulary(self):
        """Whether both sides have the same piece at each id, so that one embedding serves both
        (an imported model of one vocabulary has two SentencePiece models but one vocabulary)."""
        return self.shared or self.source.piece_list() == self.target.piece_list()

    def encode_source(self, text, max_length=None):
        """Source text -> the ids the model reads (`Vocabulary.encode`)."""
        return self.source.encode(text, max_length)

    def digest(self):
        """A hash of both sides (`Vocabulary.digest`; of the one, for a shared vocabulary): equal
        for tokenizers that give the same ids."""
        if self.shared:
            return self.source.digest()
        return hashlib.sha256(f"{self.source.digest()} {self.target.digest()}".encode()).hexdigest()
