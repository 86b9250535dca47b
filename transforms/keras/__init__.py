"""TensorFlow 2 / Keras: mixed precision policies (compile/fit scripts)."""
