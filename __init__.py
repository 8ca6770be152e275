"""seq2serve: a serving runtime for encoder-decoder and cross-attention models."""
