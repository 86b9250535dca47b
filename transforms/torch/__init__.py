"""The PyTorch targets: native AMP (autocast + GradScaler) and apex, on one shared analysis."""
