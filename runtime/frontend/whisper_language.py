"""Whisper's language detection, as HF's `WhisperForConditionalGeneration.detect_language`
does it: one decoder step after `<|startoftranscript|>` over the audio, the most likely of the
model's language tokens.

Here the step is a scoring request per language token (`[sot, <|xx|>]`, the second token's
log-prob), all over one encoder input (`GenerateReqInput.decoder_variants`: the audio is read
and sent once, encoded once, and the transcription that follows finds its encoder output in
the encoder cache). Log-probs are the logits less one constant per step, so their argmax over
the language tokens is HF's (which masks the other logits and takes the argmax).
"""

from __future__ import annotations

from typing import Any

from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.transcription import WhisperPrompt


def detection_request(whisper: WhisperPrompt, audio: Any,
                      user: str | None = None) -> tuple[GenerateReqInput, list[str]]:
    """The scoring request, and the language codes its results come back in."""
    langs = sorted(whisper.lang_to_id.items(), key=lambda kv: kv[1])
    if not langs:
        raise ValueError("this model has no language tokens to detect a language with")
    sot = whisper.decoder_start_token_id
    variants = [[sot, token_id] for _, token_id in langs]
    obj = GenerateReqInput(audio_data=audio, decoder_input_ids=variants[0],
                           decoder_variants=variants, return_logprob=True, logprob_start_len=1,
                           sampling_params={"max_new_tokens": 0}, user=user)
    return obj, [token.strip("<|>") for token, _ in langs]


def detected(results: list[dict[str, Any]], codes: list[str]) -> tuple[str, dict[str, float]]:
    """The likeliest language's code and every language's log-prob, from the results."""
    scores = {code: r["meta_info"]["input_token_logprobs"][-1][0]
              for code, r in zip(codes, results)}
    return max(codes, key=scores.__getitem__), scores
