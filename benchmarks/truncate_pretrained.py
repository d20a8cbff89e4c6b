"""A smaller pretrained encoder made from a bigger one: its first ``--layers`` transformer layers
(embeddings and tokenizer unchanged), written as a local Hugging Face folder.

    python benchmarks/truncate_pretrained.py minilm --layers 3 --out runs/pretrained/minilm-l3

The peer a user picks instead of a budgeted checkpoint when no smaller checkpoint of the same
family can be downloaded (offline, all-MiniLM-L6-v2 is the only pretrained encoder here; online
one would take paraphrase-MiniLM-L3-v2): keeping the bottom layers of a pretrained BERT and
fine-tuning it is the strong "top-layer dropping" baseline of Sajjad et al. (2023, "On the effect
of dropping layers of pre-trained transformer models"). Fine-tune it with ``baa experiment`` and
``pretrained.path`` set to the folder (configs/minilm_l3_bbc_short.yaml). The folder is written
atomically: a failure leaves nothing at ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from budgeted_attention.errors import BAAError
from budgeted_attention.io import environment_info
from budgeted_attention.pipeline.builders import PretrainedConfig

COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def truncate(source: str, layers: int, out: Path) -> Path:
    """Write the first ``layers`` layers of the BERT-family checkpoint ``source`` to ``out``."""
    from transformers import AutoModel  # noqa: PLC0415 - the hf extra

    path = Path(PretrainedConfig(source).resolved())
    model = AutoModel.from_pretrained(path)
    total = model.config.num_hidden_layers
    if not 1 <= layers < total:
        raise BAAError(f"--layers must be in [1, {total - 1}] for '{source}' ({total} layers), got {layers}")
    model.encoder.layer = model.encoder.layer[:layers]
    model.config.num_hidden_layers = layers
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        for name in COPIED:
            if (path / name).is_file():
                shutil.copy2(path / name, staging / name)
        info = {"source": str(source), "layers_kept": layers, "layers_of_source": total, "environment": environment_info()}
        (staging / "truncated_from.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="'minilm' (offline), a local folder or a hub name")
    parser.add_argument("--layers", type=int, required=True, help="how many of the bottom layers to keep")
    parser.add_argument("--out", type=Path, required=True, help="folder to write")
    args = parser.parse_args(argv)
    try:
        out = truncate(args.source, args.layers, args.out)
    except (BAAError, OSError, ValueError) as exc:
        print(f"truncate_pretrained: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({args.layers} layers of '{args.source}')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
