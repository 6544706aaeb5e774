"""training.train's flags, each declared once, as a row of `FLAGS`: its name, type, default (or the
`--config` preset's), help, the check its value must pass, and what resuming a run folder does
when it changes. `training.train.parse_args`, the resume check (`RunFolder.check_resume`,
training/run_folder.py), the model's config (`MODEL_FIELDS`) and the corpus' options
(`corpus_options`: training.train's and a run folder's `load_corpora`) are read from it, so a flag
that a resume must respect is its row and its test.

The decoding flags of the evaluations are the search's own (`keras_transformer.search.OPTIONS`).
"""

import dataclasses

from keras_transformer.config import ACTIVATIONS, POSITIONAL_ENCODINGS, PRESETS
from keras_transformer.search.flags import flag_of
from training.shards import TOKENIZER_SAMPLE

BACKENDS = ("tensorflow", "jax")  # the Keras backends training.train runs on (training/backends/)

PRESET = "the preset's"  # a default: the value in PRESETS[--config]["training"]

# A check: the words of its error ("--steps must be positive, got 0") and the test.
POSITIVE = ("positive", lambda value: value > 0)
NONE_OR_POSITIVE = ("0 (none) or positive", lambda value: value >= 0)
NON_NEGATIVE = (">= 0", lambda value: value >= 0)

# What a resume does with a value other than the run folder's last segment's. REFUSED: it makes
# the run what it is (its data and how the processes share them, the tokenizer; `processes`:
# each process' position in its share of the data is in the checkpoints). REPORTED: it changes
# the math from the resumed step on (the schedule, the loss, dropout, the batch), printed before
# the first step. Any other (--steps, --checkpoint-every, ...) just changes.
REFUSED = "refused"
REPORTED = "reported"


@dataclasses.dataclass(frozen=True)
class Flag:
    """A flag of training.train.

    Args:
        name: the key of `args` and of the settings in training.json; the flag is `--` and the
            name with dashes.
        type: int, float or str; bool for a switch (off unless given).
        default: its value when not given: a value, None, or `PRESET`.
        help: what it does, for --help.
        check: (words, test) that a given value must pass, e.g. `POSITIVE`; None: any value.
        resume: `REFUSED`, `REPORTED` or None (a resume may change it freely).
        recorded: the value of a run folder from before the flag existed (None: every run folder
            records it).
        model: a `TransformerConfig` field that the flag overrides on top of the preset's model
            (config.json holds it; a resume refuses a change, dropout's aside).
        corpus: a keyword of `data.load_corpus` that picks the corpus with `--dataset` and the
            languages (`corpus_options`).
        options: other keywords of `argparse`'s `add_argument` (choices, metavar).
    """

    name: str
    type: type = str
    default: object = None
    help: str = ""
    check: tuple = None
    resume: str = None
    recorded: object = None
    model: bool = False
    corpus: bool = False
    options: dict = dataclasses.field(default_factory=dict)

    @property
    def flag(self):
        return flag_of(self.name)

    def add_to(self, parser):
        if self.type is bool:  # a model field's switch is None when not given: the preset's value holds
            default = None if self.model else False
            parser.add_argument(self.flag, action="store_true", default=default, help=self.help, **self.options)
            return
        default = None if self.default is PRESET else self.default
        parser.add_argument(self.flag, type=self.type, default=default, help=self.help, **self.options)

    def error(self, value):
        """The error for `value`, or None when it passes the check (or is not given)."""
        if self.check is None or value is None or self.check[1](value):
            return None
        return f"{self.flag} must be {self.check[0]}, got {value}"


def _model(name, type_, help, choices=None):
    rate = "dropout" in name  # 0 allowed; a resume reports its change
    check = POSITIVE if type_ in (int, float) and not rate else None
    return Flag(name, type_, help=f"override the config's {help}", check=check, resume=REPORTED if rate else None,
                model=True, options=dict(choices=choices) if choices else {})  # fmt: skip


FLAGS = (
    Flag("run_dir", help="where the tokenizer, checkpoints, logs and metrics go", options=dict(required=True)),
    Flag("config", default="tiny", help=f"model size and training preset: {', '.join(PRESETS)} "
         "(keras_transformer.config.PRESETS)"),  # fmt: skip
    # The data.
    Flag("dataset", default="synthetic", help="synthetic, tfds:NAME, or a folder of text files", resume=REFUSED),
    Flag("source_lang", help="source language (file suffix, or TFDS feature name)", resume=REFUSED),
    Flag("target_lang", help="target language; several, comma-separated (de,fr,cs), for one model that writes "
         "each (training/languages.py)", resume=REFUSED),  # fmt: skip
    Flag("pairs", help="the directions of one model, SRC-TGT,... (en-de,de-en,en-fr), instead of --source-lang and "
         "--target-lang; each source starts with its target language's tag", resume=REFUSED),  # fmt: skip
    Flag("pair_temperature", float, 1.0, "how the pairs of several are mixed: 1 as their sizes are, larger evens them "
         "out (each pair's share of the data to the power 1/T)", POSITIVE, REFUSED, recorded=1.0),  # fmt: skip
    Flag("dev_split", default="dev", help="file prefix of the dev split of a folder (Multi30k: val)", resume=REFUSED,
         corpus=True),  # fmt: skip
    Flag("test_split", default="test", help="file prefix of the test split of a folder (Multi30k: test2016)",
         resume=REFUSED, corpus=True),  # fmt: skip
    Flag("data_dir", help="TFDS data_dir (a GCS bucket on a TPU)", corpus=True),
    # How long, and the update.
    Flag("steps", int, PRESET, "total training steps (tiny: 600, base: 100k, big: 300k)", POSITIVE),
    Flag("max_minutes", float, None, "stop (with a checkpoint) once training has taken this long, resumes included",
         POSITIVE),  # fmt: skip
    Flag("batch_tokens", int, PRESET, "source (and target) tokens per update (paper: 25000), over every device and "
         "--accumulate-steps batch", POSITIVE, REPORTED),  # fmt: skip
    Flag("accumulate_steps", int, 1, "batches whose gradients make one update, each of batch-tokens / N tokens: the "
         "paper's batch on fewer devices (keras_transformer.config.PRESETS)", POSITIVE),  # fmt: skip
    Flag("warmup_steps", int, PRESET, "section 5.3 warm-up (paper: 4000)", POSITIVE, REPORTED),
    Flag("learning_rate_scale", float, PRESET, "a factor on the section 5.3 learning rate (paper: 1)", None, REPORTED,
         recorded=1.0),  # fmt: skip
    Flag("label_smoothing", float, 0.1, "epsilon_ls of section 5.4 (paper: 0.1)", resume=REPORTED),
    # The model, on top of the preset's (TransformerConfig's fields).
    _model("num_layers", int, "N, layers in the encoder and in the decoder"),
    _model("encoder_layers", int, "encoder layers (instead of --num-layers' N)"),
    _model("decoder_layers", int, "decoder layers (instead of --num-layers' N)"),
    _model("d_model", int, "d_model"),
    _model("num_heads", int, "h, attention heads"),
    _model("d_ff", int, "feed-forward inner width"),
    _model("dropout", float, "P_drop (residual and embedding dropout)"),
    _model("attention_dropout", float, "dropout on the attention weights"),
    _model("relu_dropout", float, "dropout inside the feed-forward network"),
    _model("activation", str, "feed-forward activation (section 3.3: relu; OPUS-MT: swish)", ACTIVATIONS),
    _model("positional_encoding", str, "position encoding: the paper's sinusoids, the same with the sines first "
           "(Marian's), or a learned table (Table 3 row E)", POSITIONAL_ENCODINGS),  # fmt: skip
    _model("layer_norm_epsilon", float, "LayerNorm epsilon"),
    _model("logits_bias", bool, "bias on the output logits: none in the paper, a trained one in Marian"),
    # The tokenizer and the batches.
    Flag("vocab_size", int, PRESET, "SentencePiece vocabulary, an upper bound (paper: 37000)", POSITIVE, REFUSED),
    Flag("separate_vocabularies", bool, help="a SentencePiece model for each side (each of --vocab-size pieces at most) "
         "and a source embedding of its own; the paper shares one vocabulary (section 3.4)", resume=REFUSED,
         recorded=False),  # fmt: skip
    Flag("tokenizer_sample", int, TOKENIZER_SAMPLE, "training pairs SentencePiece learns from, drawn uniformly from "
         "the whole split", POSITIVE, REFUSED),  # fmt: skip
    Flag("max_length", int, PRESET, "longest sentence in tokens; longer training pairs are dropped", POSITIVE),
    Flag("steps_per_call", int, 50, "training steps per host call (one compiled loop)", POSITIVE),
    # Checkpoints and evaluations.
    Flag("checkpoint_every", int, PRESET, "steps between checkpoints", POSITIVE),
    Flag("checkpoint_every_minutes", float, 0, "also a checkpoint each time training has taken this many more "
         "minutes (0: none); the paper averaged the last 5 of 10-minute checkpoints", NONE_OR_POSITIVE),  # fmt: skip
    Flag("keep_checkpoints", int, 5, "checkpoints kept (at least --average-last)", POSITIVE),
    Flag("average_last", int, PRESET, "when training ends, average the last N checkpoints into DIR/averaged/, the "
         "model it evaluates and that evaluate and export use (section 6.1: 5 for base, 20 for big; 0: none)",
         NON_NEGATIVE),  # fmt: skip
    Flag("eval_every", int, 0, "steps between dev BLEU evaluations (0: at the end only)", NON_NEGATIVE),
    Flag("eval_every_minutes", float, 0, "training minutes between dev BLEU evaluations (0: none), for a learning "
         "curve against time (training.learning_curve)", NON_NEGATIVE),  # fmt: skip
    Flag("eval_sentences", int, 500, "dev sentences for BLEU during training", POSITIVE),
    Flag("keep_best", bool, help="keep the weights of the best dev BLEU (the evaluations of --eval-every, "
         "--eval-every-minutes and the end) in DIR/best/, outside the rotation: --checkpoint best"),  # fmt: skip
    Flag("early_stop", int, None, "end training after PATIENCE dev evaluations in a row without an improvement of "
         "--min-delta", POSITIVE, options=dict(metavar="PATIENCE")),  # fmt: skip
    Flag("min_delta", float, 0.0, "the dev BLEU an evaluation must gain on the best to improve on it (0: any gain)",
         NON_NEGATIVE),  # fmt: skip
    # Where and how the step runs.
    Flag("backend", help="Keras' backend (default: KERAS_BACKEND, else tensorflow)", resume=REFUSED,
         recorded="tensorflow", options=dict(choices=BACKENDS)),  # fmt: skip
    Flag("strategy", default="auto", help="auto, tpu, mirrored, multiworker or cpu (JAX: auto, tpu or cpu)"),
    Flag("processes", default="1", help="JAX: processes training as one, one per host: auto on a Cloud TPU pod "
         "slice (JAX finds the rest), else their number, with --coordinator-address and --process-id",
         resume=REFUSED, recorded=1),  # fmt: skip  (recorded as the number that trained)
    Flag("coordinator_address", help="JAX across hosts: HOST:PORT of process 0, reachable from the others"),
    Flag("process_id", int, None, "JAX across hosts: this process' index, 0 to --processes - 1"),
    Flag("heartbeat_seconds", int, None, "JAX across hosts: how long a silent process is waited for before the "
         "others end (JAX's heartbeat; default: training/backends/jax.py's HEARTBEAT_SECONDS)", POSITIVE),  # fmt: skip
    Flag("mixed_precision", bool, help="bfloat16 (TensorFlow on GPU: float16 with loss scaling)"),
    Flag("no_xla", bool, help="run the step without XLA (for comparison)"),
    Flag("no_evaluate", bool, help="skip the test evaluation at the end"),
    Flag("init_from", help="fine-tune: start a new run from another run's checkpoint (latest, a step, averaged or "
         "best; default latest), with its tokenizer and model (model flags that differ are refused; dropout and "
         "--max-length are these flags'), a fresh optimizer and these flags' schedule and data",
         options=dict(metavar="RUN[:CHECKPOINT]")),  # fmt: skip
    Flag("seed", int, 0, resume=REFUSED, corpus=True),  # the synthetic corpus' too
)  # fmt: skip

# The TransformerConfig fields a flag overrides.
MODEL_FIELDS = tuple(flag.name for flag in FLAGS if flag.model)


def corpus_options(settings):
    """The keywords of `data.load_corpus` besides the dataset and the languages, from `settings`
    (flags' names -> values: `vars(args)`, or a run's training.json; a missing one: its default)."""
    return {flag.name: settings.get(flag.name, flag.default) for flag in FLAGS if flag.corpus}


def resumed():
    """What a resume does with each setting it does not take freely: name -> (REFUSED or
    REPORTED, the value of run folders from before it was recorded). Model fields other than
    dropout are compared in config.json and refused."""
    return {flag.name: (flag.resume, flag.recorded) for flag in FLAGS if flag.resume}


def add_flags(parser):
    for flag in FLAGS:
        flag.add_to(parser)


def apply_preset_and_check(parser, args):
    """Fills the `PRESET` defaults from `--config`'s preset, then ends `parser` with the error of
    the first flag whose value fails its check."""
    if args.config not in PRESETS:
        parser.error(f"--config {args.config!r}: choose {', '.join(PRESETS)}")
    for name, value in PRESETS[args.config]["training"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for flag in FLAGS:
        if (error := flag.error(getattr(args, flag.name))) is not None:
            parser.error(error)

