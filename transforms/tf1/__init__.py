"""The TensorFlow 1.x target: the mixed precision graph rewrite."""
