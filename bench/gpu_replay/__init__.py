"""Runs disc_tf's compiled CUDA clusters on a GPU without TensorFlow (see bench/README.md)."""
