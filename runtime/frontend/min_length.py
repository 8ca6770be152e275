"""How long a request must run before it may stop, counted as HF's generate counts it.

The runtime counts `min_new_tokens` from the end of the decoder prompt. HF counts its
`min_new_tokens` with the tokens it forces as generated ones (the `forced_bos_token_id` this
runtime puts in the prompt: `TokenizedRequest.decoder_forced`), and generation_config.json's
`min_length` (bart-large-cnn's 56) bounds the whole decoder sequence, start token included.
A caller's `min_new_tokens` replaces `min_length` (HF's `_prepare_generated_length`); the
max length still wins over both."""

from __future__ import annotations

from seq2serve.runtime.config.sampling_params import SamplingParams


def runtime_min_new_tokens(sp: SamplingParams, given: bool, decoder_len: int, forced: int,
                           min_length: int) -> int:
    """The runtime's min_new_tokens for a request whose decoder prompt has `decoder_len`
    tokens, `forced` of them HF's generated ones; `given`: the caller set min_new_tokens,
    else the model's `min_length` holds."""
    want = sp.min_new_tokens - forced if given else min_length - decoder_len
    return min(max(want, 0), sp.max_new_tokens)
