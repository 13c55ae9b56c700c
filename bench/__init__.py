"""Benchmarks of disc_tf against TensorFlow and XLA (see bench/README.md)."""
