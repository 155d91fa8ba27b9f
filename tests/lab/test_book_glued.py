"""grpo_lab.lab.book.glued: reading what another chapter glued, from its committed notebook."""

import json

import pytest

from grpo_lab.lab import book


def _nb(tmp_path, outputs):
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": outputs}], "metadata": {},
          "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "09_x.ipynb").write_text(json.dumps(nb))


def _glue(name, text, prefix="application/papermill.record/"):
    return {"output_type": "display_data", "data": {prefix + "text/plain": text},
            "metadata": {"scrapbook": {"name": name, "mime_prefix": prefix}}}


def test_reads_strings_without_quotes_and_numbers_as_displayed(tmp_path):
    _nb(tmp_path, [_glue("ci", "'0.684 [0.643, 0.725]'"), _glue("n", "198"), _glue("q", "\"it's\""),
                   {"output_type": "stream", "name": "stdout", "text": "x"}])
    assert book.glued("09_x", "ci", tmp_path) == "0.684 [0.643, 0.725]"
    assert book.glued("09_x", "n", tmp_path) == "198"  # a number comes back as its display text
    assert book.glued("09_x", "q", tmp_path) == "it's"


def test_errors_name_the_problem(tmp_path):
    _nb(tmp_path, [_glue("a", "'x'"), {"output_type": "display_data", "data": {"image/png": "..."},
                                       "metadata": {"scrapbook": {"name": "fig", "mime_prefix": ""}}}])
    with pytest.raises(FileNotFoundError, match="no notebook"):
        book.glued("10_missing", "a", tmp_path)
    with pytest.raises(KeyError, match="glues no 'b'.*2 names"):
        book.glued("09_x", "b", tmp_path)
    with pytest.raises(ValueError, match="no text/plain"):
        book.glued("09_x", "fig", tmp_path)


def test_reads_the_committed_chapters():
    # chapter 1's test-set size is glued as a number by chapter 4 (the shared arithmetic test set)
    assert book.glued("04_gspo", "gspo_n_test") == "198"
    assert book.glued("03_dr_grpo", "repro_verdict").startswith("does not reproduce")
