"""The tokenizer of a FoX model as a ``transformers`` tokenizer: ``FoXTokenizerFast``, a ``PreTrainedTokenizerFast``
that applies the text escape of the model's training data (``data.text_escape``; ``json`` for LongCrawl64, whose
documents were tokenized as ``json.dumps(text)[1:-1]``), and the functions that build and save one.

Importing ``forgetting_transformer.hf`` registers the class with ``AutoTokenizer``, so
``AutoTokenizer.from_pretrained(dir)`` gives it back with the escape recorded in ``dir/tokenizer_config.json``
(without that import transformers falls back to its plain tokenizer class, which does not escape). See docs/hf.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..data.tokenizer import escape_text, text_escape_name, unescape_text

__all__ = ["FoXTokenizerFast", "saved_text_escape", "fox_tokenizer", "save_tokenizer"]


def _escape_inputs(x, mode: str):
    """A text, a batch of texts, pre-split words (nested lists) or a pair's side, each string escaped."""
    if isinstance(x, str):
        return escape_text(x, mode)
    if isinstance(x, (list, tuple)):
        return type(x)(_escape_inputs(y, mode) for y in x)
    return x


class FoXTokenizerFast(PreTrainedTokenizerFast):
    """A ``PreTrainedTokenizerFast`` with ``text_escape`` (an init keyword, saved in tokenizer_config.json; default
    ``"none"``). With ``"json"`` every text is escaped (``json.dumps(text)[1:-1]``) before BPE, so ``tok(text)``,
    ``tok.encode``, ``tok.tokenize`` and padded batches give the ids the model was trained on, and ``decode`` /
    ``batch_decode`` unescape what BPE decodes (``data.tokenizer.json_unescape``: a cut-off escape at the end of a
    generation is dropped, never an error). ``return_offsets_mapping`` is refused in json mode: the offsets would
    index the escaped text, not the one given.

    The class has no ``__init__`` of its own on purpose: transformers 5 loads a tokenizer.json as it is only for
    such a subclass; one with its own ``__init__`` gets its backend rebuilt from the vocabulary and merges alone,
    without the pre-tokenizer."""

    @property
    def text_escape(self) -> str:
        return text_escape_name(self.init_kwargs.get("text_escape", "none"), "tokenizer_config.json text_escape")

    def _encode_plus(self, text, text_pair=None, **kwargs):
        # every encoding path of a fast tokenizer in transformers 5 (__call__, encode, tokenize) ends here
        mode = self.text_escape
        if mode != "none":
            if kwargs.get("return_offsets_mapping"):
                raise ValueError(f"return_offsets_mapping is not supported with text_escape={mode}: the offsets "
                                 f"would index the escaped text, not the text given")
            text, text_pair = _escape_inputs(text, mode), _escape_inputs(text_pair, mode)
        return super()._encode_plus(text, text_pair, **kwargs)

    def _decode(self, token_ids, *args, **kwargs) -> str:
        # decode and batch_decode (one sequence at a time) end here
        return unescape_text(super()._decode(token_ids, *args, **kwargs), self.text_escape)


def saved_text_escape(directory) -> str | None:
    """The ``text_escape`` recorded in ``directory/tokenizer_config.json``; None when there is no such file or key
    (a tokenizer saved by other code, e.g. a copy of GPT-2's, which records no escape)."""
    path = Path(directory) / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("text_escape")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{path}: not a JSON object ({e})") from e
    return None if value is None else text_escape_name(value, f"{path}: text_escape")


def _backend(source):
    """``(tokenizers.Tokenizer, recorded text_escape or None, name for messages)`` of a tokenizer source."""
    from tokenizers import Tokenizer

    if isinstance(source, Tokenizer):
        return source, None, "the tokenizer"
    if isinstance(source, PreTrainedTokenizerBase):
        return source.backend_tokenizer, source.init_kwargs.get("text_escape"), source.name_or_path or "the tokenizer"
    path = Path(source)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path)).backend_tokenizer, saved_text_escape(path), str(path)
    if path.is_file():
        return Tokenizer.from_file(str(path)), None, str(path)
    raise FileNotFoundError(f"tokenizer {path} not found (expected a tokenizer.json or a Hugging Face tokenizer "
                            f"directory)")


def fox_tokenizer(source, *, bos_id: int, text_escape: str = "none") -> FoXTokenizerFast:
    """``source`` (a tokenizer.json path, a Hugging Face tokenizer directory, a ``tokenizers.Tokenizer`` or a
    ``transformers`` fast tokenizer) as a FoX model reads text: bos = eos = pad = the token ``bos_id``, bos prepended
    to every text (training rows start with it), left padding (what ``generate`` needs), and ``text_escape``
    (``"none"`` or ``"json"``) applied. A source that records another escape (a directory's tokenizer_config.json,
    a ``FoXTokenizerFast``) is refused, naming both."""
    mode = text_escape_name(text_escape)
    backend, recorded, where = _backend(source)
    if recorded is not None and text_escape_name(recorded, f"{where}: text_escape") != mode:
        raise ValueError(f"{where} records text_escape={recorded} but the model reads text escaped with "
                         f"text_escape={mode}: its ids would mean other text; use the model's own tokenizer")
    token = backend.id_to_token(int(bos_id))
    if token is None:
        raise ValueError(f"{where} has no token with id bos_id={bos_id}")
    return FoXTokenizerFast(tokenizer_object=backend, bos_token=token, eos_token=token, pad_token=token,
                            add_bos_token=True, padding_side="left", text_escape=mode)


def save_tokenizer(source, out_dir, *, bos_id: int, text_escape: str) -> FoXTokenizerFast:
    """Write ``fox_tokenizer(source, bos_id=..., text_escape=...)`` to ``out_dir`` (tokenizer.json and
    tokenizer_config.json, which records ``tokenizer_class: FoXTokenizerFast`` and ``text_escape``) and return it.
    ``AutoTokenizer.from_pretrained(out_dir)`` after ``import forgetting_transformer.hf`` loads it back."""
    tok = fox_tokenizer(source, bos_id=bos_id, text_escape=text_escape)
    tok.save_pretrained(str(out_dir))
    return tok
