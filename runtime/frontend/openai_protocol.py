"""Request bodies of the HTTP API (OpenAI-compatible, SGLang-native, translations).

No field is silently ignored: every body refuses an unknown field (`extra="forbid"`: a 400
naming it), and a field a body declares only to refuse it is in its `REFUSED` table
(`refused_fields.py`): a 400 naming it unless its value asks for nothing this server lacks."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    field_validator,
    model_validator,
)

from seq2serve.runtime.frontend.generate_request import invalid_text
from seq2serve.runtime.frontend.refused_fields import FUNCTIONS, STRICT, TOOL_CHOICE, Refused

Stop = str | list[str] | None
Language = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 400 naming it
    REFUSED: ClassVar[dict[str, Refused]] = {}

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


class JsonSchemaFormat(_Body):
    """OpenAI's `response_format.json_schema`. The schema is enforced by the grammar whatever
    `strict` says (OpenAI's strict mode: properties not named are not written); without a
    schema, any JSON object."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's `response_format`: text, any JSON object, or a JSON Schema's objects
    (`frontend/response_format.py` turns it into the request's grammar)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('json_schema is given exactly when type is "json_schema"')
        return self


class StreamOptions(_Body):
    REFUSED: ClassVar[dict[str, Refused]] = {
        "include_obfuscation": Refused("streamed events carry no obfuscation padding here",
                                       (None, False)),
    }
    include_usage: bool = False
    include_obfuscation: Any = None


class _OpenAISampling(SGLangExtras):
    """The fields completions and chat completions share. `n` has no upper bound here: the
    server's --max-n limit applies (a 400 naming it). `user` keys the caches under cache
    isolation and the namespace of rids (README: "Caches")."""

    REFUSED: ClassVar[dict[str, Refused]] = {
        "logit_bias": Refused("the sampler has no per-token bias yet", (None, {})),
        # SGLang's and vLLM's admission priority
        "priority": Refused("the scheduler admits requests first come, first served (it has no "
                            "priority policy)"),
    }

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
    # grammars (at most one): OpenAI's response_format, SGLang's extra fields (a JSON Schema
    # as text or an object, a regular expression, an EBNF grammar)
    response_format: ResponseFormat | None = None
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    # refused by name (REFUSED)
    logit_bias: dict[str, float] | None = None
    priority: Any = None


class CompletionRequest(_OpenAISampling):
    REFUSED: ClassVar[dict[str, Refused]] = {
        **_OpenAISampling.REFUSED,
        "echo": Refused("the prompt is not returned with the completion (for an "
                        "encoder-decoder model it is the encoder's input, not the output's "
                        "start)", (None, False)),
        "suffix": Refused("insertion (text after the completion) is not implemented",
                          (None, "")),
        "best_of": Refused("the server returns every sample it draws: best_of may only equal n",
                           lambda value, body: value is None or value == body.n),
    }
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: Any = None
    suffix: Any = None
    best_of: Any = None


class CalledFunction(_Body):
    name: str
    arguments: str  # a JSON object (tool_use.py checks it)


class MessageToolCall(_Body):
    """A call an assistant message made (a function tool's: OpenAI's custom tools are not
    taken)."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Body):
    """A message: its role and content go through the chat template, with an assistant's
    `tool_calls` and a tool result's `tool_call_id` where the template takes tools
    (`tool_use.py`); the fields a message of the functions API or of audio has are refused by
    name."""

    REFUSED: ClassVar[dict[str, Refused]] = {
        "name": Refused("the chat template gets a message's role and content only; put the "
                        "name in the content"),
        "function_call": Refused(FUNCTIONS),
        "audio": Refused("these models take and make no audio"),
        "refusal": Refused("a refusal is not rendered into the prompt; send it as content"),
    }
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    # refused by name (REFUSED)
    name: Any = None
    function_call: Any = None
    audio: Any = None
    refusal: Any = None


class FunctionDefinition(_Body):
    REFUSED: ClassVar[dict[str, Refused]] = {
        "strict": Refused(STRICT, (None, False)),
    }
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of an object
    strict: Any = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema and schema.get("type", "object") != "object":
            raise ValueError('must be a JSON Schema of an object ("type": "object")')
        if schema and not isinstance(schema.get("properties", {}), dict):
            raise ValueError("properties must be an object (a JSON Schema per argument)")
        return schema


class FunctionTool(_Body):
    type: str
    function: FunctionDefinition

    @field_validator("type")
    @classmethod
    def _function_only(cls, kind: str) -> str:
        if kind != "function":
            raise ValueError(f"only function tools are taken here, not {kind!r} (a custom "
                             f"tool's free-form input has no Llama 3 call format)")
        return kind


_PROMPT_CACHE_DEFAULTS = ({}, {"mode": "implicit"}, {"ttl": "30m"},
                          {"mode": "implicit", "ttl": "30m"})


class ChatCompletionRequest(_OpenAISampling):
    """Chat completions. Accepted and not used, as they change nothing a response holds:
    `metadata` (nothing is stored), `safety_identifier` (no abuse detection here) and
    `prompt_cache_key` (the prefix cache matches any prompt by itself; `user` keys it)."""

    REFUSED: ClassVar[dict[str, Refused]] = {
        **_OpenAISampling.REFUSED,
        "tool_choice": Refused(TOOL_CHOICE, lambda value, body: value in (
            None, "none", "auto", "required") or (isinstance(value, dict)
                                                  and value.get("type") == "function")),
        "functions": Refused(FUNCTIONS, (None, [])),
        "function_call": Refused(FUNCTIONS + '; only "none"', (None, "none")),
        "audio": Refused("these models make no audio"),
        "modalities": Refused('text is the only output: only ["text"]', (None, ["text"])),
        "prediction": Refused("predicted outputs are not implemented"),
        "web_search_options": Refused("no web search here"),
        "moderation": Refused("no moderation model runs here"),
        "service_tier": Refused('one service tier here: only "auto" or "default"',
                                (None, "auto", "default")),
        "store": Refused("nothing is stored here: only false", (None, False)),
        "reasoning_effort": Refused('these models do not reason: only "none"', (None, "none")),
        "verbosity": Refused('these models have no verbosity control: only "medium" (the '
                             'default)', (None, "medium")),
        "prompt_cache_retention": Refused(
            "the caches here evict the least recently used entries when memory runs short, "
            "with no time bound (/flush_cache empties them)"),
        "prompt_cache_options": Refused(
            "prefix caching here is automatic (no breakpoints) and has no time bound: only "
            'the defaults (mode "implicit", ttl "30m")', (None, *_PROMPT_CACHE_DEFAULTS)),
    }
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # accepted, not used (see the docstring)
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # tools: for a Llama 3.x chat model (tool_use.py); tool_choice "required" and a named
    # function force a call with a grammar
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # refused by name (REFUSED)
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    moderation: Any = None
    service_tier: Any = None
    store: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None


class GenerateRequest(_Body):
    """SGLang's native /generate request."""

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
    """The sampling fields a translation cannot honour (several results per input, log-probs)
    are refused by name (`REFUSED`), as unknown fields are; several translations of an input
    are `alternatives`."""

    REFUSED: ClassVar[dict[str, Refused]] = {
        "n": Refused("one translation per input; send the input again for another, or ask "
                     "for alternatives", (None, 1)),
        "num_return_sequences": Refused("one translation per input (the beam search's best); "
                                        "alternatives: k gives the k best", (None, 1)),
        "logprobs": Refused("translations do not return log-probs; use /generate",
                            (None, False)),
        "best_of": Refused("one translation per input", (None, 1)),
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
    # issue 42 (docs/translation.md): LibreTranslate's alternatives (the k best of a beam
    # search), CTranslate2's target_prefix (one for every input, or one per input), scores
    alternatives: StrictInt | None = None
    target_prefix: StrictStr | list[StrictStr] | None = None
    return_scores: StrictBool = False
    # {"source term": "target term", ...} or the name of a server glossary (--glossary);
    # checked by glossary.py, whose errors name the field
    glossary: Any = None
    # refused by name (see REFUSED)
    n: int | None = None
    num_return_sequences: int | None = None
    logprobs: Any = None
    best_of: int | None = None


class TokenizeRequest(_Body):
    """vLLM's /tokenize body; `prompt` may also be a list (then lists come back)."""

    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True


class AbortBody(_Body):
    rid: str
    user: str | None = None  # the user who sent the request (rids are per user)


class DetectRequest(_Body):
    """LibreTranslate's /detect body: one text or a list. LibreTranslate clients send their key
    as `api_key`; here it goes in the Authorization header, so a key in the body is refused."""

    REFUSED: ClassVar[dict[str, Refused]] = {
        "api_key": Refused("send the API key as 'Authorization: Bearer KEY'; a key in the body "
                           "is not read", (None, "")),
    }
    q: str | list[str]
    api_key: str | None = None


class EmbeddingRequest(_Body):
    """OpenAI's /v1/embeddings: each input's encoder output, mean-pooled and L2-normalised."""

    REFUSED: ClassVar[dict[str, Refused]] = {
        "dimensions": Refused("an embedding has the encoder's d_model dimensions; shortening "
                              "it is not implemented"),
    }
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Any = None
    user: str | None = None
