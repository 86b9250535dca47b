"""`ampify verify`: run a patched script and prove that mixed precision engaged."""
