"""Model hyperparameters: `PRESETS`, the paper's Table 3 rows (base, big) and presets for smaller
corpora and machines, each a constructor of `TransformerConfig` of its name;
`TransformerConfig.preset(name)` takes any of them by name, as the command lines do."""

import dataclasses
import json

# The paper's sinusoids (sin and cos interleaved), the same with all sines first (tensor2tensor's
# and Marian's layout), or a learned table (Table 3 row E).
POSITIONAL_ENCODINGS = ("sinusoidal", "sinusoidal_halves", "learned")
ACTIVATIONS = ("relu", "swish")  # the feed-forward network's: the paper's, and Marian's (OPUS-MT)
LAYER_NORM_EPSILON = 1e-6

# The presets, each a model shape with the training settings that go with it (`training.train
# --config NAME` reads both). base and big are the paper's (Table 3; section 5: 25,000-token
# batches, warm-up 4,000, 100k and 300k steps, a shared 37,000-token vocabulary; section 6.1:
# the model is the average of the last 5 checkpoints, or 20 for big). tiny (not in
# the paper) trains the built-in synthetic corpus to BLEU > 95 in minutes on a 2-core CPU, with
# the paper's learning rate and its last checkpoints averaged (section 6.1), so that its result
# does not hang on one noisy step, which a CPU's rounding decides (bench/README.md, "The main job");
# small (not in the paper) is for corpora of Multi30k's size (29,000 pairs); multi30k (not in the
# paper) is the recipe measured there (bench/README.md): Wu et al.'s (2021) narrow 4 + 4 layers
# with high dropout, which in 20-minute probes took twice small's steps a minute and led it by
# 5.7 val BLEU. multi30k_shallow (not in the paper) keeps its 4 encoder layers and has 1 decoder
# layer (Kasai et al. 2021, "Deep Encoder, Shallow Decoder"), with dropout 0.2 for the smaller
# model: after 25 training minutes on Multi30k it is 0.31 test BLEU behind multi30k and serves
# 1.8x its sentences at batch 32, 2.3x at batch 1 (bench/README.md, "Decoder depth and the
# shortlist").
#
# base and big's `batch_tokens` is an update's: on fewer than the paper's 8 GPUs (3,125 tokens
# each a step), `training.train --accumulate-steps N` makes each update from N batches of
# 25,000 / N tokens, as one. The paper's per-device batch, 25,000 / (devices * N) = 3,125:
#     devices           1   2   4   8  (GPUs, or TPU chips: a v5e-1, a v4-8's 4 chips, a v5e-8)
#     --accumulate-steps 8   4   2   1
# (`paper_accumulate_steps`). A device with memory to spare (a TPU v5e's 16 GB in bfloat16) may
# take a smaller N.
# The training of the presets for corpora of Multi30k's size.
SMALL_CORPUS_TRAINING = dict(steps=20_000, batch_tokens=3072, warmup_steps=1000, learning_rate_scale=1.0, vocab_size=8000,
                             max_length=128, checkpoint_every=200, average_last=0)  # fmt: skip
PRESETS = {
    "tiny": {
        "model": dict(num_layers=2, d_model=128, num_heads=4, d_ff=512),
        "training": dict(steps=600, batch_tokens=3072, warmup_steps=400, learning_rate_scale=1.0, vocab_size=4000,
                         max_length=64, checkpoint_every=50, average_last=5),
    },
    "small": {
        "model": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024),
        "training": SMALL_CORPUS_TRAINING,
    },
    "multi30k": {
        "model": dict(num_layers=4, d_model=128, num_heads=4, d_ff=512, dropout=0.3),
        "training": SMALL_CORPUS_TRAINING,
    },
    "multi30k_shallow": {
        "model": dict(encoder_layers=4, decoder_layers=1, d_model=128, num_heads=4, d_ff=512, dropout=0.2),
        "training": SMALL_CORPUS_TRAINING,
    },
    "base": {
        "model": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1),
        "training": dict(steps=100_000, batch_tokens=25_000, warmup_steps=4000, learning_rate_scale=1.0,
                         vocab_size=37_000, max_length=256, checkpoint_every=2000, average_last=5),
    },
    "big": {
        "model": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
        "training": dict(steps=300_000, batch_tokens=25_000, warmup_steps=4000, learning_rate_scale=1.0,
                         vocab_size=37_000, max_length=256, checkpoint_every=2000, average_last=20),
    },
}  # fmt: skip


PAPER_DEVICES = 8  # the paper's GPUs: its 25,000-token update was 8 batches of 3,125 tokens


def paper_accumulate_steps(devices):
    """The `--accumulate-steps` that gives each of `devices` the paper's 3,125 tokens a batch."""
    return max(1, PAPER_DEVICES // devices)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Everything that fixes the shape of a `Transformer`.

    Args:
        vocab_size: size of the one vocabulary shared by source and target (section 3.4), or
            of the target's alone with `source_vocab_size`. Id 0 is padding.
        source_vocab_size: None: the source shares the target's vocabulary and embedding (the
            paper's). Else the size of the source's own vocabulary, with an embedding of its own
            (some OPUS-MT models); the output projection stays tied to the target's embedding.
        encoder_layers: N of the encoder (section 3.1; default: `num_layers`).
        decoder_layers: N of the decoder. The decoder runs once a generated token, the encoder
            once a sentence: a deep encoder and a shallow decoder (Kasai et al. 2021) translate
            faster at about the same quality.
        d_model: width of every sub-layer output and of the embeddings.
        num_heads: h, the attention heads; `d_k = d_v = d_model / h` (section 3.2.2).
        d_ff: inner width of the position-wise feed-forward network (section 3.3).
        dropout: P_drop, on every sub-layer output and on embedding + position sums (section 5.4).
        attention_dropout: dropout on the attention weights (0 in the paper).
        relu_dropout: dropout on the feed-forward network's inner activations (0 in the paper).
        positional_encoding: "sinusoidal" (section 3.5), "sinusoidal_halves" (the same
            sinusoids, the sines in the first half of the dimensions: Marian, OPUS-MT) or
            "learned" (Table 3 row E).
        activation: the feed-forward network's, "relu" (section 3.3) or "swish" (OPUS-MT).
        layer_norm_epsilon: the epsilon of every LayerNorm.
        logits_bias: a trained bias `[vocab]` on the output logits (Marian's; the paper's
            pre-softmax projection has none).
        max_length: the longest sequence in tokens: the rows of a learned position table, and
            the length sources are cut to at serving time.
        num_layers: the shorthand for both depths (the paper's N, default 6): each stack whose
            own field is not given has this many layers. Read back, `config.num_layers` is the
            depth both stacks share, None when they differ.
    """

    vocab_size: int
    source_vocab_size: int | None = None
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    relu_dropout: float = 0.0
    positional_encoding: str = "sinusoidal"
    max_length: int = 256
    activation: str = "relu"
    layer_norm_epsilon: float = LAYER_NORM_EPSILON
    logits_bias: bool = False
    num_layers: dataclasses.InitVar[int | None] = None

    def __post_init__(self, num_layers):
        depths = (self.encoder_layers, self.decoder_layers)
        if num_layers is not None and None not in depths and depths != (num_layers, num_layers):
            raise ValueError(
                f"TransformerConfig: num_layers={num_layers!r} is the depth of a stack whose own field is not given, "
                f"but both are (encoder_layers={self.encoder_layers}, decoder_layers={self.decoder_layers})."
            )
        for name in ("encoder_layers", "decoder_layers"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, 6 if num_layers is None else num_layers)
        for name in ("vocab_size", "encoder_layers", "decoder_layers", "d_model", "num_heads", "d_ff", "max_length",
                     "source_vocab_size"):  # fmt: skip
            value = getattr(self, name)
            if name == "source_vocab_size" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {value!r}.")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} is not divisible by "
                f"num_heads={self.num_heads}: each head needs d_model / num_heads dimensions."
            )
        for name in ("dropout", "attention_dropout", "relu_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"TransformerConfig.{name} must be in [0, 1), got {value!r}.")
        for name, choices in (("positional_encoding", POSITIONAL_ENCODINGS), ("activation", ACTIVATIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"TransformerConfig.{name} must be one of {choices}, got {getattr(self, name)!r}.")
        if not 0.0 < self.layer_norm_epsilon < 1.0:
            raise ValueError(f"TransformerConfig.layer_norm_epsilon must be in (0, 1), got {self.layer_norm_epsilon}.")

    @classmethod
    def preset(cls, name, vocab_size, **overrides):
        """A preset of `PRESETS` by name, as the command lines take it; each also has a
        constructor of its name (`TransformerConfig.base(vocab_size)`)."""
        if name not in PRESETS:
            raise ValueError(f"Unknown config {name!r}: choose {', '.join(PRESETS)}.")
        model = dict(PRESETS[name]["model"])
        depth = model.pop("num_layers", None)
        if overrides.get("num_layers") is None:  # else the shorthand overrides the preset's depths
            model = {"encoder_layers": depth, "decoder_layers": depth, **model}
        else:
            model = {key: value for key, value in model.items() if not key.endswith("_layers")}
        return cls(vocab_size=vocab_size, **{**model, **overrides})

    @classmethod
    def tiny(cls, vocab_size, **overrides):
        """A small model that trains in minutes on a CPU (not in the paper)."""
        return cls.preset("tiny", vocab_size, **overrides)

    @classmethod
    def small(cls, vocab_size, **overrides):
        """3 + 3 layers of width 256, for corpora such as Multi30k (not in the paper)."""
        return cls.preset("small", vocab_size, **overrides)

    @classmethod
    def multi30k(cls, vocab_size, **overrides):
        """The recipe measured on Multi30k: narrow, with high dropout (not in the paper)."""
        return cls.preset("multi30k", vocab_size, **overrides)

    @classmethod
    def multi30k_shallow(cls, vocab_size, **overrides):
        """multi30k with a shallow decoder, faster to serve (not in the paper)."""
        return cls.preset("multi30k_shallow", vocab_size, **overrides)

    @classmethod
    def base(cls, vocab_size, **overrides):
        """The paper's base model (Table 3): 65M parameters with a 37k vocabulary."""
        return cls.preset("base", vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size, **overrides):
        """The paper's big model (Table 3): 213M parameters, P_drop 0.3 for EN-DE."""
        return cls.preset("big", vocab_size, **overrides)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        """The config of `to_dict`'s `values`, or of a config.json written before the two depths,
        which has `num_layers`."""
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)} - {"num_layers"}
        if unknown:
            raise ValueError(f"Unknown TransformerConfig fields: {sorted(unknown)}.")
        return cls(**values)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))


def _num_layers(config):
    return config.encoder_layers if config.encoder_layers == config.decoder_layers else None


# `num_layers` is an init-only shorthand; read back, it is the depth both stacks share (None when
# they differ), which also lets `dataclasses.replace` pass it on unchanged.
TransformerConfig.num_layers = property(_num_layers)
