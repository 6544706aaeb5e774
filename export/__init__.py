"""From a training run folder to a SavedModel that TF Serving and other TF programs can use."""
