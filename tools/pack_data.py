"""Pack the self-distilled data for committing: data/selfdistill/<split>.jsonl -> <split>.jsonl.gz.

The top-k logits (kept only for an optional distillation term) are left out: they are large, and
`tools/make_data.py --topk 8` regenerates them (greedy decoding is deterministic).
    python -m tools.pack_data train heldout
"""

import gzip
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "selfdistill"


def main(argv=None) -> None:
    for split in (sys.argv[1:] if argv is None else argv) or ["train", "heldout"]:
        rows = []
        for line in (DATA / f"{split}.jsonl").read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interruption
            rows.append({k: v for k, v in row.items() if not k.startswith("topk")})
        rows.sort(key=lambda r: r["id"])
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        (DATA / f"{split}.jsonl.gz").write_bytes(gzip.compress(payload, compresslevel=9, mtime=0))
        print(f"{split}: {len(rows)} rows, {len(payload) / 1e6:.1f} MB -> {(DATA / f'{split}.jsonl.gz').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":  # importable: tools/ is a package
    main()
