"""What a caller asks for (`GenerateReqInput`) and its checks, before tokenization."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class GenerateReqInput:
    """One call of generate: a single prompt or a batch. For encoder-decoder models `text` /
    `input_ids` are the encoder input and `decoder_input_ids` an optional forced decoder prefix
    (HF style: the decoder start token is prepended when missing)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    decoder_input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # with return_logprob: also score the decoder input from this position on (the decoder
    # start token of an encoder-decoder model, or a decoder-only prompt's first token, is
    # position 0); None or -1: only the generated tokens (SGLang's default)
    logprob_start_len: int | None = None
    rid: str | list[str] | None = None
    # images of each prompt (vision models): one image or a list per prompt
    image_data: Any = None
    # audio (speech models, Whisper): the encoder input itself, in place of text / input_ids;
    # one audio (file bytes, a path, or 16 kHz samples as a 1-D float array), or a list of
    # them for a batch
    audio_data: Any = None
    # each audio's first log-mel frame (internal: Whisper's re-decoding of a window from its
    # last complete segment, HF's `seek`; frontend/whisper_seek.py): the encoder reads the
    # window's frames from there on, zero-padded; one for every audio, or one per audio
    audio_seek: int | list[int] = 0
    user: str | None = None  # the caller's user id: caches are per user under isolation
    # decoder_input_ids' tokens after the start token that stand for a forced first generated
    # token (a translation's target language; TokenizedRequest.decoder_forced); one for every
    # prompt, or a list with one per prompt
    decoder_forced: int | list[int] = 0
    # data parallelism: show meta_info.replica (the engine's caller, an admin over HTTP: the
    # replica a request went to may tell a user that another sent the same content)
    show_replica: bool = False
    # one prompt's encoder input under several decoder prompts (internal: Whisper's language
    # detection scores each language token): one request per list, results in this order;
    # the input is read, tokenized and sent once, and encoded once
    decoder_variants: list[list[int]] | None = None
    # each prompt's embedding (the encoder's output, mean-pooled and L2-normalised: meta_info
    # "embedding") in place of generated text; encoder-decoder text models only
    embed: bool = False
    # the caller the scheduler's fair admission counts this call under (internal: the batches
    # `split_rows` cuts one call into share one, so a call of 4,096 prompts is one caller);
    # None: a caller of its own
    group: str | None = None

    def normalize(self) -> tuple[bool, list[dict[str, Any]]]:
        """(is_batch, one dict per prompt with keys text|input_ids, decoder_input_ids,
        sampling_params, rid); raises ValueError naming the bad field."""
        given = [self.text is not None, self.input_ids is not None, self.audio_data is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of text (prompt), input_ids or audio_data")
        if self.audio_data is not None:
            is_batch = isinstance(self.audio_data, list)
            audios = self.audio_data if is_batch else [self.audio_data]
            if not audios:
                raise ValueError("audio_data is an empty list")
            items = [{"input_ids": [], "audio_data": a} for a in audios]
        elif self.text is not None:
            is_batch = isinstance(self.text, list)
            prompts = self.text if is_batch else [self.text]
            if not prompts:
                raise ValueError("text (prompt) is an empty list")
            for i, t in enumerate(prompts):
                if not isinstance(t, str):
                    raise ValueError(f"text[{i}] must be a string, got {type(t).__name__}")
                if not t:
                    raise ValueError(f"text[{i}] is empty" if is_batch else "text is empty")
            items = [{"text": t} for t in prompts]
        else:
            is_batch = _is_batch_of_ids(self.input_ids, "input_ids")
            seqs = self.input_ids if is_batch else [self.input_ids]
            if not seqs:
                raise ValueError("input_ids is an empty list")
            for i, s in enumerate(seqs):
                if not s:
                    raise ValueError(f"input_ids[{i}] is empty" if is_batch
                                     else "input_ids is empty")
            items = [{"input_ids": list(s)} for s in seqs]
        n = len(items)
        for key, value in (("decoder_input_ids", self.decoder_input_ids),
                           ("sampling_params", self.sampling_params), ("rid", self.rid),
                           ("image_data", self.image_data),
                           ("decoder_forced", self.decoder_forced),
                           ("audio_seek", self.audio_seek)):
            per = _per_prompt(key, value, n, is_batch)
            for item, v in zip(items, per):
                item[key] = v
        for item in items:
            item.setdefault("audio_data", None)
            item["image_data"] = _prompt_images(item["image_data"])
            d = item["decoder_input_ids"]
            if d is not None and (not isinstance(d, list) or not all(_is_int(t) for t in d)):
                raise ValueError("decoder_input_ids must be a list of token ids")
            if item["rid"] is not None and not isinstance(item["rid"], str):
                raise ValueError("rid must be a string")
            if not _is_int(item["decoder_forced"]) or item["decoder_forced"] < 0:
                raise ValueError("decoder_forced must be an integer >= 0 (or a list of them)")
            seek = item["audio_seek"]
            if not _is_int(seek) or not 0 <= seek < 3000 or (seek and
                                                               item["audio_data"] is None):
                raise ValueError("audio_seek must be a log-mel frame in [0, 3000) of an "
                                 "audio_data input (or a list of them)")
        if self.decoder_variants is not None and (
                is_batch or not self.decoder_variants or not all(
                    isinstance(v, list) and v and all(_is_int(t) for t in v)
                    for v in self.decoder_variants)):
            raise ValueError("decoder_variants must be non-empty lists of token ids, for a "
                             "single prompt")
        if self.user is not None and not isinstance(self.user, str):
            raise ValueError("user must be a string")
        if not isinstance(self.stream, bool):
            raise ValueError("stream must be a boolean")
        if not isinstance(self.return_logprob, bool):
            raise ValueError("return_logprob must be a boolean")
        if not _is_int(self.top_logprobs_num) or not 0 <= self.top_logprobs_num <= 20:
            raise ValueError("top_logprobs_num must be an integer in [0, 20]")
        if self.logprob_start_len == -1:
            self.logprob_start_len = None
        if self.logprob_start_len is not None:
            if not _is_int(self.logprob_start_len) or self.logprob_start_len < 0:
                raise ValueError("logprob_start_len must be an integer >= 0 (or -1: none)")
            if not self.return_logprob:
                raise ValueError("logprob_start_len needs return_logprob")
        return is_batch, items


def split_rows(obj: GenerateReqInput, max_rows: int,
               max_images: int | None = None) -> list[GenerateReqInput]:
    """`obj` as consecutive batches of at most `max_rows` rows each, and of at most
    `max_images` images (None: any), whose results in order are `obj`'s. A prompt's rows and
    images never split: one prompt over a limit stays alone, to be refused. A single prompt,
    or a batch within the limits, is returned as it is."""
    prompts = next(p for p in (obj.text, obj.input_ids, obj.audio_data, []) if p is not None)
    is_batch = isinstance(prompts, list) and bool(prompts) and (
        obj.input_ids is None or isinstance(prompts[0], list))
    if not is_batch:
        return [obj]
    n = len(prompts)
    fields = {k: _per_prompt(k, getattr(obj, k), n, True) for k in
              ("decoder_input_ids", "sampling_params", "rid", "image_data", "decoder_forced",
               "audio_seek")
              if getattr(obj, k) is not None}
    rows = [rows_per_prompt(sp) for sp in fields.get("sampling_params", [None] * n)]
    images = [len(_prompt_images(v)) for v in fields.get("image_data", [None] * n)]
    max_images = sum(images) if max_images is None else max_images
    if sum(rows) <= max_rows and sum(images) <= max_images:
        return [obj]
    chunks, start, count, held = [], 0, 0, 0
    group = obj.group or uuid.uuid4().hex  # one caller: admitted as fairly as one batch
    # (a sentinel row count closes the last chunk)
    for i, (r, m) in enumerate(zip(rows + [max_rows + 1], images + [0])):
        if count and (count + r > max_rows or held + m > max_images or i == n):
            part = slice(start, i)
            chunks.append(dataclasses.replace(
                obj, **{_prompt_field(obj): prompts[part]},
                **{k: v[part] for k, v in fields.items()}, group=group))
            start, count, held = i, 0, 0
        count += r
        held += m
    return chunks


def _prompt_images(image_data: Any) -> list:
    """One prompt's `image_data` (None, one image, or a list of them) as a list."""
    if image_data is None:
        return []
    return image_data if isinstance(image_data, list) else [image_data]


def _prompt_field(obj: GenerateReqInput) -> str:
    """The field that holds the prompts: text, input_ids or audio_data."""
    if obj.text is not None:
        return "text"
    return "input_ids" if obj.input_ids is not None else "audio_data"


def results_per_prompt(sampling_params: Any) -> int:
    """How many results one prompt's sampling params ask for: n samples, or a beam search's
    num_return_sequences (the two do not combine). Unchecked values count as 1."""
    if not isinstance(sampling_params, dict):
        return 1
    counts = [sampling_params.get(k) for k in ("n", "num_return_sequences")]
    return max([c for c in counts if _is_int(c)] + [1])


def rows_per_prompt(sampling_params: Any) -> int:
    """How many decoding rows one prompt's sampling params cost: n samples, or a beam
    search's num_beams beams (what max_batch_inputs caps). Unchecked values count as 1."""
    if not isinstance(sampling_params, dict):
        return 1
    counts = [sampling_params.get(k) for k in ("n", "num_beams", "num_return_sequences")]
    return max([c for c in counts if _is_int(c)] + [1])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_batch_of_ids(ids: Any, name: str) -> bool:
    if not isinstance(ids, list):
        raise ValueError(f"{name} must be a list of token ids or a list of such lists")
    if ids and all(isinstance(s, list) for s in ids):
        for s in ids:
            if not all(_is_int(t) for t in s):
                raise ValueError(f"{name} must hold integer token ids")
        return True
    if not all(_is_int(t) for t in ids):
        raise ValueError(f"{name} must be a list of token ids or a list of such lists")
    return False


def _per_prompt(key: str, value: Any, n: int, is_batch: bool) -> list[Any]:
    """Spread a per-call value over the prompts, or check a per-prompt list's length."""
    # decoder_input_ids for a batch is a list of lists (None: that prompt has none); a flat
    # list is shared by all prompts
    shared_ids = key == "decoder_input_ids" and not (
        value and (value[0] is None or isinstance(value[0], list)))
    if is_batch and isinstance(value, list) and not shared_ids:
        if len(value) != n:
            raise ValueError(f"{key} has {len(value)} entries for {n} prompts")
        return list(value)
    if key == "rid" and is_batch and value is not None:
        raise ValueError("rid must be a list with one id per prompt for a batch")
    return [value] * n


def invalid_text(value: Any, path: str = "") -> str | None:
    """Where `value` (a JSON body or a part of it) holds a string that is not valid Unicode (a
    lone UTF-16 surrogate such as "\\ud800", which JSON allows and no tokenizer takes): a
    description naming the field, or None. (The field's path is built only when one is found:
    every request's body is walked.)"""
    found = _bad_string(value)
    if found is None:
        return None
    keys, text, e = found
    where = ".".join(str(k) for k in ([path] if path else []) + keys)
    return (f"{where or 'the body'}: invalid Unicode at character {e.start} (a lone "
            f"surrogate {text[e.start]!a}); send UTF-8 text")


def _bad_string(value: Any) -> tuple[list, str, UnicodeEncodeError] | None:
    """The first string of `value` that UTF-8 cannot encode: (its keys from `value`, the
    string, the error)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return [], value, e
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        if all(type(x) is int for x in value):  # token ids: the common long list
            return None
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _bad_string(item)
        if found is not None:
            found[0].insert(0, key)
            return found
    return None
