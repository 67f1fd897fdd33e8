"""Constrained decoding with xgrammar: compiled grammars (cached), one matcher per sequence,
one token bitmask per step over the constrained rows of the batch.

A constraint is compiled when its request is added, so an invalid schema,
regex or grammar is a ``ValueError`` before any work is queued. Constrained
and free requests share every step: only the constrained rows are masked.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from llmp.sampling_params import StructuredOutputsParams

_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")
# whitespace runs inside JSON are capped: enough for deep indentation, not for a model stuck emitting blanks
MAX_WHITESPACE_RUN = 16
COMPILED_CACHE_SIZE = 256


class GrammarCompiler:
    """Compiles constraints against one tokenizer; xgrammar caches the compiled grammars by source."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        import xgrammar as xgr

        from llmp.model_files.tokenizer import transformers_tokenizer

        self.vocab_size = vocab_size
        stop = sorted(eos_token_ids) or None
        # xgrammar reads the vocabulary's kind from transformers' class (loaded here on the first constraint)
        detected = xgr.TokenizerInfo.from_huggingface(
            transformers_tokenizer(tokenizer), vocab_size=vocab_size, stop_token_ids=stop
        )
        # special tokens (<s>, <|im_start|>) as empty strings: xgrammar never allows an empty token, where
        # it would read "<s>" as that text although the detokenizer drops it
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        special.update(
            i for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items() if getattr(t, "special", False)
        )
        vocab = [""] * vocab_size
        for token, index in tokenizer.get_vocab().items():
            if index < vocab_size and index not in special:
                vocab[index] = token
        info = xgr.TokenizerInfo(
            vocab,
            detected.vocab_type,
            vocab_size=vocab_size,
            stop_token_ids=stop,
            add_prefix_space=detected.add_prefix_space,
        )
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        self.compiled: OrderedDict[str, Any] = OrderedDict()  # by the constraint's text: checks are not redone

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``params``; ``ValueError`` naming the problem if it is invalid."""
        key = json.dumps([params.kind, getattr(params, params.kind), params.disable_any_whitespace], sort_keys=True)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self._compile(params)
            self.compiled[key] = compiled
            if len(self.compiled) > COMPILED_CACHE_SIZE:
                self.compiled.popitem(last=False)
        self.compiled.move_to_end(key)
        return compiled

    def _compile(self, params: StructuredOutputsParams) -> Any:
        kind = params.kind
        try:
            if kind in ("json", "json_object"):
                schema = checked_schema(params.json) if kind == "json" else '{"type": "object"}'
                compact = params.disable_any_whitespace
                return self.compiler.compile_json_schema(
                    schema,
                    any_whitespace=not compact,
                    max_whitespace_cnt=None if compact else MAX_WHITESPACE_RUN,
                    strict_mode=kind == "json",
                )
            if kind == "regex":
                return self.compiler.compile_regex(params.regex)
            if kind == "choice":
                literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
                return self.compiler.compile_grammar(f"root ::= {literals}")
            if kind == "grammar":
                return self.compiler.compile_grammar(params.grammar)
            return self.compiler.compile_structural_tag(params.structural_tag)
        except (RuntimeError, ValueError, TypeError) as error:
            message = _XGRAMMAR_PREFIX.sub("", str(error).strip())
            raise ValueError(f"invalid structured_outputs.{kind}: {message}") from None

    def state(self, compiled: Any, after_token_ids: Sequence[int] | None) -> GrammarState:
        return GrammarState(compiled, tuple(after_token_ids or ()))


def checked_schema(schema: str | dict[str, Any]) -> str:
    """The schema as JSON text, after checking it is a valid JSON schema."""
    import jsonschema

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"the schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise ValueError("the schema must be a JSON object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        path = "/".join(str(p) for p in error.path)
        raise ValueError(
            f"the schema is not a valid JSON schema{f' at {path}' if path else ''}: {error.message}"
        ) from None
    _refuse_unenforced(schema)
    return json.dumps(bounded_strings_as_patterns(schema))


# JSON-schema keywords xgrammar (0.2.x) accepts and does not enforce: output would break them while the
# request looked constrained, so a schema using one is refused (as vLLM refuses them for xgrammar)
UNENFORCED_KEYWORDS = (
    "uniqueItems", "contains", "minContains", "maxContains", "not", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "dependencies",
)  # fmt: skip
# string formats xgrammar enforces (vLLM's STRING_SUPPORTED_FORMATS); it ignores any other
STRING_FORMATS = frozenset(
    {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri", "uri-reference",
     "uri-template", "json-pointer", "relative-json-pointer"}
)  # fmt: skip
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> subschema
_SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def _refuse_unenforced(schema: Any) -> None:
    found = unenforced_keywords(schema)
    if found:
        where, keyword = found[0]
        place = f" at {where}" if where else ""
        if keyword == "allOf":
            raise ValueError(
                f"the schema's allOf{place} has several subschemas, which structured outputs cannot enforce "
                "together: merge them into one"
            )
        if keyword == "format":
            raise ValueError(
                f"the schema's string format{place} is not one structured outputs can enforce "
                f"({', '.join(sorted(STRING_FORMATS))}): leave it out or give a pattern"
            )
        if keyword in ("minLength", "maxLength"):
            raise ValueError(
                f"the schema's {keyword}{place} is beside a pattern or a format, which structured outputs cannot "
                "enforce together: put the length in the pattern"
            )
        raise ValueError(
            f"the schema uses {keyword!r}{place}, which structured outputs cannot enforce: leave it out "
            "(and check the output yourself)"
        )


def _unenforced_here(schema: dict[str, Any]) -> list[str]:
    """The keywords of this one (sub)schema xgrammar would ignore: :data:`UNENFORCED_KEYWORDS`, ``multipleOf``,
    a string ``format`` it does not know, and a string's length bounds beside a pattern or a format."""
    found = [k for k in UNENFORCED_KEYWORDS if k in schema and not (k == "uniqueItems" and schema[k] is False)]
    kind = schema.get("type")
    types = set(kind) if isinstance(kind, list) else {kind}
    if "multipleOf" in schema and types & {"integer", "number"}:
        found.append("multipleOf")
    if "string" in types:
        if "format" in schema and schema["format"] not in STRING_FORMATS:
            found.append("format")
        if "pattern" in schema or "format" in schema:
            found += [k for k in ("minLength", "maxLength") if k in schema]
    return found


def unenforced_keywords(schema: Any, at: str = "") -> list[tuple[str, str]]:
    """``(path, keyword)`` of each :data:`UNENFORCED_KEYWORDS` use in ``schema`` (and each ``allOf`` of
    several subschemas), in document order."""
    if not isinstance(schema, dict):
        return []
    found = [(at, keyword) for keyword in _unenforced_here(schema)]
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        found.append((at, "allOf"))
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                found += unenforced_keywords(sub, f"{at}/{key}/{name}".lstrip("/"))
    for key in _SCHEMA_VALUES:
        found += unenforced_keywords(schema.get(key), f"{at}/{key}".lstrip("/"))
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for index, sub in enumerate(schema[key]):
                found += unenforced_keywords(sub, f"{at}/{key}/{index}".lstrip("/"))
    return found


def without_unenforced(schema: Any) -> Any:
    """``schema`` less what :func:`unenforced_keywords` finds (an ``allOf`` of several subschemas whole):
    the part of a tool's parameters a forced call can be held to."""
    if isinstance(schema, list):
        return [without_unenforced(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    unenforced = _unenforced_here(schema)
    for key, value in schema.items():
        if key in unenforced or (key == "allOf" and isinstance(value, list) and len(value) > 1):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: without_unenforced(sub) for name, sub in value.items()}
        elif key in _SCHEMA_VALUES or key in _SCHEMA_LISTS:
            out[key] = without_unenforced(value)
        else:
            out[key] = value
    return out


def bounded_strings_as_patterns(schema: Any) -> Any:
    """The schema with each length-bounded string (minLength/maxLength, no pattern or format) given as
    a pattern of that many characters instead.

    xgrammar (0.2.x) turns a length-bounded string into ``[^"\\\r\n]{min,max}``, which lets raw
    control characters through: the output is then not JSON. A pattern is matched with JSON
    string rules (control characters excluded); the bounded string holds no escapes, a small loss.
    """
    if isinstance(schema, list):
        return [bounded_strings_as_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: bounded_strings_as_patterns(value) if key not in ("enum", "const", "default", "examples") else value
        for key, value in schema.items()
    }
    bounded = "minLength" in out or "maxLength" in out
    kind = out.get("type")
    stringy = kind in (None, "string") or (isinstance(kind, list) and "string" in kind)  # lengths bind strings only
    if stringy and bounded and "pattern" not in out and "format" not in out:
        low, high = int(out.pop("minLength", 0)), out.pop("maxLength", None)
        out["pattern"] = f'^[^"\\\\\\x00-\\x1f]{{{low},{"" if high is None else int(high)}}}$'
    return out


class GrammarState:
    """The grammar matcher of one sequence. Inactive until the output holds ``after`` (if given)."""

    def __init__(self, compiled: Any, after: tuple[int, ...]) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.after = after
        self.active = not after

    def accept(self, token_id: int, output_token_ids: Sequence[int]) -> bool:
        """Advance over a sampled token; True when the sequence must end (grammar complete or broken)."""
        if not self.active:
            n = len(self.after)
            self.active = len(output_token_ids) >= n and tuple(output_token_ids[-n:]) == self.after
            return False
        if not self.matcher.accept_token(token_id):
            return True  # every token was masked (a constraint conflicting with allowed_token_ids)
        return self.matcher.is_terminated()


def grammar_bitmask(states: Sequence[GrammarState | None], vocab_size: int) -> tuple[torch.Tensor, list[int]] | None:
    """The token bitmask of a step's active grammar rows (xgrammar's layout, int32 ``[R, ceil(V/32)]``:
    token ``t`` allowed when bit ``t % 32`` of word ``t // 32`` is set) and those rows; None without any.
    Filled here, where the matchers live; applied where the logits are (:func:`apply_token_bitmask`)."""
    import xgrammar as xgr

    rows = [i for i, state in enumerate(states) if state is not None and state.active]
    if not rows:
        return None
    bitmask = xgr.allocate_token_bitmask(len(states), vocab_size)
    for i in rows:
        states[i].matcher.fill_next_token_bitmask(bitmask, i)
    return bitmask, rows


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Mask ``logits`` [R, V] rows ``rows`` to the tokens ``bitmask`` allows, in place, on the logits'
    device (plain torch: the bits unpacked, no xgrammar kernel needed where the model runs)."""
    index = torch.tensor(list(rows), device=logits.device)
    words = bitmask.to(logits.device, non_blocking=True)[index]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().reshape(len(rows), -1)
    vocab = logits.shape[-1]
    if allowed.shape[-1] < vocab:  # tokens past the grammar's vocabulary: never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]))
    logits[index] = logits[index].masked_fill(~allowed[:, :vocab], float("-inf"))
