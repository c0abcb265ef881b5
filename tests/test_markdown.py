"""forgetting_transformer.markdown: the one Markdown table builder."""

import pytest

from forgetting_transformer.markdown import header, row, table


def test_a_table_is_its_header_separator_and_rows():
    assert table(["run", "loss", "ok"], [["a", 1.5, "yes"], ["b", "–", ""]], "lrc") == "\n".join([
        "| run | loss | ok |", "|---|---:|:---:|", "| a | 1.5 | yes |", "| b | – |  |"])


def test_the_default_alignment_is_a_label_then_numbers():
    assert header(["model", "x", "y"]).splitlines()[1] == "|---|---:|---:|"
    assert row(["m", 2]) == "| m | 2 |"
    assert table(["a"], []) == "| a |\n|---|"


@pytest.mark.parametrize("headers, rows, align, match", [
    (["a", "b"], [], "l", "one of l, r, c per column"),
    (["a", "b"], [], "lx", "one of l, r, c per column"),
    (["a", "b"], [["1"]], None, "a row has 1 cells for 2 columns"),
])
def test_bad_alignment_or_a_short_row_is_an_error(headers, rows, align, match):
    with pytest.raises(ValueError, match=match):
        table(headers, rows, align)
