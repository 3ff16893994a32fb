"""UNITER in pure PyTorch: encoder, masking, IPOT, pretraining and downstream heads (no I/O)."""
