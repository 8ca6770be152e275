"""The beam tests' oracles: Hugging Face's `generate(num_beams=...)` for the hypotheses and
`sequences_scores`, and an independent check of any hypothesis's score: HF's teacher-forced
log-probs of its tokens (through HF's own logits processors, in HF's order), summed and
divided by the generated length ** length_penalty, as `_update_finished_beams` scores it."""

from __future__ import annotations

import torch
from transformers import (
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)


def processors(decoder_prompt_len: int, stops: list[int], max_new: int, ngram: int = 0,
               repetition_penalty: float = 1.0, min_new_tokens: int = 0,
               forced_eos: int | None = None) -> LogitsProcessorList:
    """The processors HF's generate builds for these settings, in its order."""
    out = LogitsProcessorList()
    if repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    if ngram:
        out.append(NoRepeatNGramLogitsProcessor(ngram))
    if min_new_tokens:
        out.append(MinNewTokensLengthLogitsProcessor(decoder_prompt_len, min_new_tokens, stops))
    if forced_eos is not None:
        out.append(ForcedEOSTokenLogitsProcessor(decoder_prompt_len + max_new, forced_eos))
    return out


@torch.no_grad()
def teacher_forced_score(model, encoder_ids: list[int] | None, prompt: list[int],
                         tokens: list[int], procs: LogitsProcessorList, length_penalty: float,
                         counted: int = 0) -> float:
    """HF's beam score of `tokens` generated after the decoder `prompt`: the processed
    log-prob of each token given the ones before it, summed, over (len(tokens) + counted)
    ** length_penalty (`counted`: prompt tokens HF counts as generated, a forced language
    token). Decoder-only models: `encoder_ids` None, `prompt` the prompt."""
    seq = torch.tensor([prompt + tokens])
    inputs = seq[:, :-1]
    if encoder_ids is None:
        logits = model(input_ids=inputs).logits
    else:
        logits = model(input_ids=torch.tensor([encoder_ids]), decoder_input_ids=inputs).logits
    total = torch.zeros((), dtype=torch.float32)
    for i, token in enumerate(tokens):
        at = len(prompt) - 1 + i
        lp = torch.log_softmax(logits[:, at].float(), dim=-1)
        lp = procs(seq[:, :at + 1], lp)
        total = total + lp[0, token]
    return float(total / float(len(tokens) + counted) ** length_penalty)


def strip_after_stop(tokens: list[int], stops) -> list[int]:
    """A hypothesis as HF pads it, cut after its first stop token."""
    end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens) - 1)
    return tokens[:end + 1]


@torch.no_grad()
def scored_generate(model, encoder_ids: list[int], decoder_ids: list[int] | None, **gen):
    """HF generate (greedy or beams, its KV cache) with its scores: `sequences`, and
    `sequences_scores` for beams. `decoder_ids` None: its own start (and forced_bos_token_id
    when `gen` gives one); else its decoder_input_ids."""
    if decoder_ids is not None:
        gen["decoder_input_ids"] = torch.tensor([decoder_ids])
    return model.generate(torch.tensor([encoder_ids]), do_sample=False, output_scores=True,
                          return_dict_in_generate=True, **gen)


def greedy_log_prob(out, prompt_len: int) -> float:
    """A greedy `scored_generate`'s sum of its chosen tokens' log-probs (HF's processed
    scores, log-softmaxed) after the first `prompt_len` tokens of its sequence."""
    tokens = out.sequences[0, prompt_len:]
    return sum(float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, tokens))


def lower_id_first(logprobs: torch.Tensor, buckets) -> list[tuple[list[int], list[float]]]:
    """Each beam group's best `keep` candidates under the fused paths' rule (by value, best
    first, then by id = row in group * vocab + token), from the rows' log-probs + scores laid
    out in `buckets` ((groups, rows per group, keep), in row order): (ids, values) a group."""
    out, start = [], 0
    for groups, rows, keep in buckets:
        for g in range(groups):
            flat = logprobs[start + g * rows:start + (g + 1) * rows].flatten().tolist()
            ids = sorted(range(len(flat)), key=lambda j: (-flat[j], j))[:keep]
            out.append((ids, [flat[j] for j in ids]))
        start += groups * rows
    return out
