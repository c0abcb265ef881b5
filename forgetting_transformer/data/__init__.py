"""Data layer: LongCrawl64-format token stores (reader) and a converter from raw text."""

from .longcrawl64 import DataIntegrityError, LongCrawl64Dataset, load_meta, read_rows
from .prepare import EMBEDDED_CORPUS, ensure_data, ensure_prepared, prepare_corpus, unigram_entropy

__all__ = [
    "LongCrawl64Dataset",
    "DataIntegrityError",
    "read_rows",
    "load_meta",
    "prepare_corpus",
    "ensure_prepared",
    "ensure_data",
    "unigram_entropy",
    "EMBEDDED_CORPUS",
]
