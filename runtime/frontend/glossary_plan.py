"""A translation request's glossary applied to its batch of sources (issue 42): which sources
hold which terms, the checks that need the model (a target term its vocabulary can write,
options a glossary cannot be combined with), and the search that places missing terms after
the first pass (`glossary_search.py`). ValueErrors start with "glossary" (the 400's param)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.frontend.glossary import Glossary
from seq2serve.runtime.frontend.glossary_search import GlossarySearch, GlossarySource, Run
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager
from seq2serve.runtime.frontend.translation_options import TranslationOptions, target_ids


def check_combination(glossary: Glossary | None, options: TranslationOptions, stream: bool,
                      prefixes: list[str], encoder_decoder: bool) -> None:
    """What a glossary cannot be combined with: each a ValueError naming both fields."""
    if glossary is None:
        return
    for name, on in (("stream", stream), ("alternatives", options.alternatives is not None),
                     ("target_prefix", any(prefixes)),
                     ("return_scores", options.return_scores)):
        if on:
            raise ValueError(f"glossary cannot be combined with {name}: a missing term is "
                             f"placed after the translation is decoded (docs/translation.md, "
                             f"Glossaries)")
    if not encoder_decoder:
        raise ValueError("glossary needs an encoder-decoder model (this one is decoder-only)")


def inexpressible(tm: TokenizerManager, terms: list[str]) -> str | None:
    """The first target term the model cannot write exactly (its tokens as target text hold
    an unknown token, or decode to other text), or None."""
    if not terms:
        return None
    unk = tm.tokenizer.unk_token_id
    for term, ids in zip(terms, target_ids(tm, terms)):
        text = tm.tokenizer.decode(ids, skip_special_tokens=True)
        if not ids or (unk is not None and unk in ids) or term not in text:
            return term
    return None


@dataclass
class GlossaryPlan:
    """The sources that hold terms (their indices in the batch) and the search over them."""

    indices: list[int]
    search: GlossarySearch

    async def enforce(self, outputs: list[dict[str, Any]], run: Run) -> list[dict[str, Any]]:
        """Generate's outputs (one per source, in order) with every source's terms placed."""
        if not self.indices:
            return outputs
        placed = await self.search.enforce([outputs[i] for i in self.indices], run)
        out = list(outputs)
        for i, o in zip(self.indices, placed):
            out[i] = o
        return out


def glossary_plan(tm: TokenizerManager, glossary: Glossary, texts: list[str],
                  encoder_ids: list[list[int]], bases: list[list[int] | None],
                  sampling: dict[str, Any], max_new: int,
                  user: str | None) -> GlossaryPlan:
    """`texts`, `encoder_ids`, `bases`: the batch's sources, their encoder inputs and decoder
    bases (a target-language token)."""
    found = [glossary.found(t) for t in texts]
    bad = inexpressible(tm, list(dict.fromkeys(t for terms in found for t in terms)))
    if bad is not None:
        raise ValueError(f"glossary: the target term {bad!r} cannot be written with this "
                         f"model's vocabulary (its tokens are unknown or decode to other text)")
    indices = [i for i, terms in enumerate(found) if terms]
    sources = [GlossarySource(_implied_out(found[i]), encoder_ids[i], bases[i] or [])
               for i in indices]
    search = GlossarySearch(tm.tokenizer, lambda xs: target_ids(tm, xs), sources, sampling,
                            max_new, user, tm.limits.max_batch_inputs)
    return GlossaryPlan(indices, search)


def _implied_out(terms: list[str]) -> list[str]:
    """The terms without those another one contains ("hundred" is in "a hundred")."""
    return [t for t in terms if not any(t != u and t in u for u in terms)]
