"""prepare's input formats: .txt, JSONL, JSONL.gz and Parquet (text or chat) give the same tokens as the JSONL they
were written from; bytes that are not UTF-8 and rows that are not text are named by file and line."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spotrun_trainer.data import DataError, prepare

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokens(out, index) -> np.ndarray:
    return np.concatenate([np.fromfile(out / s["file"], dtype=index["dtype"]) for s in index["shards"]])


def _masks(out, index) -> list:
    return [(out / s["mask"]).read_bytes() if "mask" in s else None for s in index["shards"]]


def test_jsonl_gz_and_parquet_give_the_tokens_of_the_plain_jsonl(assets, tmp_path):
    records = [json.loads(line) for line in assets["corpus"].read_text().splitlines()[:40]]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in records))
    packed = tmp_path / "gz" / "part.jsonl.gz"
    packed.parent.mkdir()
    with gzip.open(packed, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    table = tmp_path / "pq" / "part.parquet"
    table.parent.mkdir()
    pq.write_table(pa.table({"text": [r["text"] for r in records], "id": list(range(len(records)))}), table)
    ref_index = prepare([plain], str(assets["tokenizer"]), tmp_path / "ref")
    reference = _tokens(tmp_path / "ref", ref_index)
    for name, source in (("gz", packed.parent), ("pq", table.parent)):  # directories: the files are found by name
        index = prepare([source], str(assets["tokenizer"]), tmp_path / f"out-{name}")
        assert np.array_equal(_tokens(tmp_path / f"out-{name}", index), reference), name


def test_parquet_chat_rows_are_masked_like_jsonl_chat_lines(assets, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    tok.chat_template = CHATML
    tok.save_pretrained(tmp_path / "tok")
    chats = [[{"role": "user", "content": "what resumes?"}, {"role": "assistant", "content": "our model resumes."}],
             [{"role": "system", "content": "be brief"}, {"role": "user", "content": "and the node?"},
              {"role": "assistant", "content": "a node shards its data."}]] * 5
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    table = tmp_path / "chat.parquet"
    pq.write_table(pa.table({"messages": chats}), table)
    a = prepare([jsonl], str(tmp_path / "tok"), tmp_path / "a")
    b = prepare([table], str(tmp_path / "tok"), tmp_path / "b")
    assert a["loss_mask"] and b["loss_mask"]
    assert np.array_equal(_tokens(tmp_path / "a", a), _tokens(tmp_path / "b", b))
    assert _masks(tmp_path / "a", a) == _masks(tmp_path / "b", b)


@pytest.mark.parametrize("kind", ["jsonl", "txt", "jsonl.gz"])
def test_bytes_that_are_not_utf8_are_named_by_file_and_line(assets, tmp_path, kind):
    body = b'{"text": "fine"}\n{"text": "caf\xe9"}\n' if kind != "txt" else b"fine\n\ncaf\xe9 latin-1\n"
    path = tmp_path / f"bad.{kind}"
    path.write_bytes(gzip.compress(body) if kind == "jsonl.gz" else body)
    with pytest.raises(DataError, match=rf"bad\.{kind.replace('.', '[.]')}:(2|3): not UTF-8 text \(byte 0xe9 at "
                       r"column \d+\)"):
        prepare([path], str(assets["tokenizer"]), tmp_path / "out")
    assert not (tmp_path / "out" / "index.json").exists()


def test_parquet_without_a_text_column_or_with_a_non_string_row_is_named(assets, tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a\.parquet: expected a column 'text' \(text\) or 'messages' \(chat\); "
                       "found body"):
        prepare([tmp_path / "a.parquet"], str(assets["tokenizer"]), tmp_path / "out")
    pq.write_table(pa.table({"text": ["fine", None]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet:row 2: column 'text' must be a string, got NoneType"):
        prepare([tmp_path / "b.parquet"], str(assets["tokenizer"]), tmp_path / "out2")
    (tmp_path / "c.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"c\.jsonl\.gz: not readable as \.jsonl\.gz"):
        prepare([tmp_path / "c.jsonl.gz"], str(assets["tokenizer"]), tmp_path / "out3")
