"""The benchmarks (bench/README.md). Importing any of them first quiets TensorFlow's start-up
logs, as every command line does (keras_transformer/quiet.py), under Keras' TensorFlow backend
unless KERAS_BACKEND says otherwise (the JAX rows run in processes of their own)."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from keras_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()
