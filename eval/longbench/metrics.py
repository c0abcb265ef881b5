"""LongBench (v1) metrics, reimplemented without third-party packages so that scores match LongBench's ``metrics.py``.

* ``qa_f1_score``: token F1 after LongBench's ``normalize_answer`` (SQuAD style).
* ``rouge_score``: ROUGE-L F of the ``rouge`` package (pltrdy, 1.0.1) that LongBench calls as
  ``Rouge().get_scores([pred], [ref], avg=True)["rouge-l"]["f"]``: sentences split on ``"."``, summary-level
  union LCS with ``exclusive=True`` (unique words), and 0.0 wherever the package raises (empty hypothesis).
  Not ``rouge-score`` (Google), which gives different numbers.
* ``classification_score`` (trec), ``retrieval_score`` (passage_retrieval_en), ``count_score`` (passage_count):
  line for line LongBench's, quirks included (classification removes from the list it iterates over).
* ``code_sim_score`` (lcc, repobench-p): ``fuzzywuzzy.fuzz.ratio / 100`` on the first line of the prediction
  without a backtick, ``#`` or ``//``. ``fuzz_ratio`` is fuzzywuzzy 0.18's ratio in its pure-Python mode
  (``difflib.SequenceMatcher``, what LongBench's requirements install: no python-Levenshtein).

The Chinese metrics (qa_f1_zh, rouge_zh, retrieval_zh) need jieba and are left out: Table 2 is English only.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter

# ---------------------------------------------------------------------------------------------------- QA F1


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (LongBench / SQuAD)."""
    s = s.lower()
    exclude = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in exclude)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction, ground_truth, **kwargs) -> float:
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **kwargs) -> float:
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


# ---------------------------------------------------------------------------------------------------- ROUGE-L


def _lcs_words(x: list[str], y: list[str]) -> list[str]:
    """The LCS of ``x`` and ``y`` reconstructed exactly as rouge's ``_recon_lcs`` does (same tie-breaking), but
    iteratively (the package recurses and fails on very long sentences)."""
    n, m = len(x), len(y)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        xi, row, prev = x[i - 1], table[i], table[i - 1]
        for j in range(1, m + 1):
            row[j] = prev[j - 1] + 1 if xi == y[j - 1] else max(prev[j], row[j - 1])
    out, i, j = [], n, m
    while i > 0 and j > 0:
        if x[i - 1] == y[j - 1]:
            out.append(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def _sentences(text: str) -> list[str]:
    return [" ".join(s.split()) for s in text.split(".") if len(s) > 0]


def _words(sentences: list[str]) -> list[str]:
    return [w for s in sentences for w in s.split(" ")]


def rouge_l_f(hypothesis: str, reference: str) -> float:
    """ROUGE-L F1 of the ``rouge`` package (summary level, exclusive=True); raises ValueError on empty input like
    the package."""
    hyp, ref = _sentences(hypothesis), _sentences(reference)
    if not hyp or not ref:
        raise ValueError("Collections must contain at least 1 sentence.")
    m, n = len(set(_words(ref))), len(set(_words(hyp)))
    union: set[str] = set()
    llcs = 0
    for ref_s in ref:
        ref_words = ref_s.split(" ")
        before = len(union)
        for hyp_s in hyp:
            union |= set(_lcs_words(ref_words, hyp_s.split(" ")))
        llcs += len(union) - before
    r_lcs, p_lcs = llcs / m, llcs / n
    return 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8))


def rouge_score(prediction: str, ground_truth: str, **kwargs) -> float:
    try:
        return rouge_l_f(prediction, ground_truth)
    except Exception:  # LongBench: bare except → 0.0
        return 0.0


# ---------------------------------------------------------------------------------------------------- others


def classification_score(prediction: str, ground_truth: str, **kwargs) -> float:
    em_match_list = []
    for class_name in kwargs["all_classes"]:
        if class_name in prediction:
            em_match_list.append(class_name)
    for match_term in em_match_list:  # sic: LongBench removes while iterating (skips the next element)
        if match_term in ground_truth and match_term != ground_truth:
            em_match_list.remove(match_term)
    if ground_truth in em_match_list:
        return 1.0 / len(em_match_list)
    return 0.0


def retrieval_score(prediction: str, ground_truth: str, **kwargs) -> float:
    ground_truth_id = re.findall(r"Paragraph (\d+)", ground_truth)[0]
    numbers = re.findall(r"\d+", prediction)
    right_num = sum(1 for number in numbers if str(number) == str(ground_truth_id))
    return 0.0 if len(numbers) == 0 else float(right_num / len(numbers))


def count_score(prediction: str, ground_truth, **kwargs) -> float:
    numbers = re.findall(r"\d+", prediction)
    right_num = sum(1 for number in numbers if str(number) == str(ground_truth))
    return 0.0 if len(numbers) == 0 else float(right_num / len(numbers))


def fuzz_ratio(s1: str | None, s2: str | None) -> int:
    """fuzzywuzzy 0.18 ``fuzz.ratio`` without python-Levenshtein: None → 0, equal → 100, an empty side → 0, else
    ``int(round(100 * difflib.SequenceMatcher(None, s1, s2).ratio()))``."""
    if s1 is None or s2 is None:
        return 0
    if s1 == s2:
        return 100
    if len(s1) == 0 or len(s2) == 0:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, s1, s2).ratio()))


def code_sim_score(prediction: str, ground_truth: str, **kwargs) -> float:
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if ("`" not in candidate) and ("#" not in candidate) and ("//" not in candidate):
            line = candidate
            break
    return fuzz_ratio(line, ground_truth) / 100


# ---------------------------------------------------------------------------------------------------- scoring

DATASET2METRIC = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "passage_retrieval_en": retrieval_score,
    "passage_count": count_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

# LongBench's eval.py keeps only the first line of the prediction for these (official behaviour) ...
FIRST_LINE_DATASETS = ("trec", "triviaqa", "samsum", "lsht")
# ... while the FoX paper's eval.py (Table 2) applies the first-line cut to every dataset.
POSTPROCESS_MODES = ("paper", "official")


def first_line(prediction: str) -> str:
    return prediction.lstrip("\n").split("\n")[0]


def postprocess(dataset: str, prediction: str, mode: str = "paper") -> str:
    """``mode="paper"``: first line for every dataset (FoX's eval.py); ``"official"``: only for trec, triviaqa,
    samsum (LongBench's eval.py)."""
    if mode not in POSTPROCESS_MODES:
        raise ValueError(f"postprocess mode {mode!r} not in {POSTPROCESS_MODES}")
    if mode == "paper" or dataset in FIRST_LINE_DATASETS:
        return first_line(prediction)
    return prediction


def sample_score(dataset: str, prediction: str, answers: list, all_classes=None, *, mode: str = "paper") -> float:
    """Max over the reference answers of the dataset's metric on the post-processed prediction (in [0, 1])."""
    if dataset not in DATASET2METRIC:
        raise KeyError(f"no LongBench metric for dataset {dataset!r}; known: {sorted(DATASET2METRIC)}")
    metric = DATASET2METRIC[dataset]
    prediction = postprocess(dataset, prediction, mode)
    score = 0.0
    for ground_truth in answers:
        score = max(score, metric(prediction, ground_truth, all_classes=all_classes))
    return score


def dataset_score(dataset: str, predictions: list[str], answers: list[list], all_classes=None, *,
                  mode: str = "paper") -> float:
    """LongBench's ``scorer``: ``round(100 * mean(sample scores), 2)``. ``all_classes`` is one list for the whole
    dataset (as in LongBench, which uses the last line's) or one list per prediction."""
    if not predictions:
        raise ValueError(f"{dataset}: no predictions to score")
    per_sample = all_classes is not None and len(all_classes) == len(predictions) and \
        all(isinstance(c, (list, tuple)) or c is None for c in all_classes)
    total = 0.0
    for i, (pred, gts) in enumerate(zip(predictions, answers, strict=True)):
        classes = all_classes[i] if per_sample else all_classes
        total += sample_score(dataset, pred, gts, classes, mode=mode)
    return round(100 * total / len(predictions), 2)
