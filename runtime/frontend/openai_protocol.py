"""Request bodies of the HTTP API (OpenAI-compatible, SGLang-native, translations)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from seq2serve.runtime.frontend.generate_request import invalid_text

Stop = str | list[str] | None
Language = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        problem = invalid_text(data)
        if problem:
            raise ValueError(problem)
        return data


class SGLangExtras(_Body):
    """SGLang's extra sampling parameters, accepted on the OpenAI endpoints too."""

    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    # beam search (HF's names and meanings); num_return_sequences results per prompt
    num_beams: int | None = None
    num_return_sequences: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    no_repeat_ngram_size: int | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAISampling(SGLangExtras):
    """The fields completions and chat completions share. `n` has no upper bound here: the
    server's --max-n limit applies (a 400 naming it)."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stop: Stop = None
    seed: int | None = Field(default=None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    user: str | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_Body):
    """SGLang's native /generate request."""

    model_config = ConfigDict(extra="forbid")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    decoder_input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=20)
    # with return_logprob: meta_info.input_token_logprobs from this decoder position on
    logprob_start_len: int | None = Field(default=None, ge=-1)
    rid: str | list[str] | None = None
    image_data: Any = None  # per prompt: an image (data URL / base64) or a list of them
    user: str | None = None


class TranslationRequest(_Body):
    """No field is silently ignored: an unknown one is a 400 naming it, and the sampling
    fields a translation cannot honour (several results per input, log-probs) are refused
    by name (`REFUSED`)."""

    model_config = ConfigDict(extra="forbid")
    REFUSED: ClassVar[dict[str, str]] = {
        "n": "one translation per input; send the input again for another",
        "num_return_sequences": "one translation per input (the beam search's best)",
        "logprobs": "translations do not return log-probs; use /generate",
        "best_of": "one translation per input",
    }
    model: str | None = None
    input: str | list[str]  # one document or a list of them
    # how the documents are written: text is translated sentence by sentence, markdown and
    # html in their text only (docs/translation.md)
    format: Literal["text", "markdown", "html"] = "text"
    source_lang: Language
    target_lang: Language | list[Language]  # one language for every input, or one per input
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    stream: bool = False
    user: str | None = None
    # beams: CTranslate2's beam_size or HF's num_beams (the same; unset: the model's
    # generation_config.json); one translation per input either way
    beam_size: int | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    # sampling, honoured as on the other endpoints
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0)
    stop: Stop = None
    # refused by name (see REFUSED)
    n: int | None = None
    num_return_sequences: int | None = None
    logprobs: Any = None
    best_of: int | None = None


class TokenizeRequest(_Body):
    """vLLM's /tokenize body; `prompt` may also be a list (then lists come back)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True


class AbortBody(_Body):
    rid: str
    user: str | None = None  # the user who sent the request (rids are per user)
