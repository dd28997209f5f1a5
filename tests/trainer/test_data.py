"""Token shards: prepare writes sequential shards plus an index; the loader is deterministic and resumable."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from spotrun_trainer.data import DataError, TokenShardLoader, chat_tokens, prepare, read_index


@pytest.fixture(scope="module")
def small_shards(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    index = prepare([assets["corpus"]], str(assets["tokenizer"]), out, shard_bytes=4096)
    return out, index


def test_prepare_writes_shards_of_the_requested_size_and_an_index(small_shards, assets):
    out, index = small_shards
    assert index["dtype"] == "uint16" and len(index["shards"]) > 3
    assert all(s["tokens"] == 2048 for s in index["shards"][:-1])  # 4096 bytes of uint16
    assert index["total_tokens"] == sum(s["tokens"] for s in index["shards"])
    tokens = np.concatenate([np.fromfile(out / s["file"], dtype=np.uint16) for s in index["shards"]])
    docs = [json.loads(line)["text"] for line in assets["corpus"].read_text().splitlines()]
    assert (tokens == index["eos_token_id"]).sum() == len(docs)  # one EOS per document
    assert (out / "tokenizer" / "tokenizer_config.json").exists()


def _loaders(out, dp_size, micro_batch=2, seq_len=32, seed=1):
    return [TokenShardLoader(out, seq_len=seq_len, micro_batch=micro_batch, dp_rank=r, dp_size=dp_size, seed=seed)
            for r in range(dp_size)]


@pytest.fixture
def unique_tokens(tmp_path):
    """Shards whose tokens are 0..N-1, so equal samples mean the same sample was read twice."""
    shards = []
    for i in range(5):
        np.arange(i * 1000, (i + 1) * 1000, dtype=np.uint16).tofile(tmp_path / f"shard-{i:05d}.bin")
        shards.append({"file": f"shard-{i:05d}.bin", "tokens": 1000})
    (tmp_path / "index.json").write_text(json.dumps(
        {"format": 1, "dtype": "uint16", "eos_token_id": 0, "total_tokens": 5000, "shards": shards}))
    return tmp_path


def test_ranks_read_disjoint_samples_that_cover_the_epoch(unique_tokens):
    loaders = _loaders(unique_tokens, 2)
    seen = set()
    steps_per_epoch = loaders[0].samples_per_epoch // loaders[0].global_batch
    for _ in range(steps_per_epoch):
        for loader in loaders:
            for row in loader.next_batch():
                key = row.tobytes()
                assert key not in seen
                seen.add(key)
    assert len(seen) == steps_per_epoch * 4


def test_loader_is_deterministic_and_resumes_from_its_state(unique_tokens):
    out = unique_tokens
    a = _loaders(out, 1, seq_len=100)[0]
    batches = [a.next_batch() for _ in range(50)]  # crosses into epoch 1
    assert a.state.epoch == 1
    b = _loaders(out, 1, seq_len=100)[0]
    for _ in range(20):
        b.next_batch()
    c = _loaders(out, 1, seq_len=100)[0]
    c.load_state_dict(b.state_dict())
    for expected in batches[20:]:
        assert np.array_equal(c.next_batch(), expected)


def test_epochs_visit_shards_in_different_orders(unique_tokens):
    loader = _loaders(unique_tokens, 1)[0]
    assert loader._epoch_order(0) != loader._epoch_order(1)
    assert sorted(loader._epoch_order(0)) == sorted(loader._epoch_order(1))


def test_damaged_shard_is_reported_with_its_name(small_shards, tmp_path):
    import shutil

    out, index = small_shards
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    name = index["shards"][1]["file"]
    (copy / name).write_bytes((copy / name).read_bytes()[:100])
    with pytest.raises(DataError, match=f"{name}: 100 bytes on disk"):
        read_index(copy)


def test_missing_index_and_bad_jsonl_are_clear_errors(tmp_path, assets):
    with pytest.raises(DataError, match="index.json not found: run `python -m spotrun_trainer prepare`"):
        read_index(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: expected an object with a string field 'text'"):
        prepare([bad], str(assets["tokenizer"]), tmp_path / "out")


def test_too_little_data_for_one_step_is_a_clear_error(small_shards):
    out, _ = small_shards
    with pytest.raises(DataError, match="one step needs micro_batch\\*dp_size"):
        TokenShardLoader(out, seq_len=2000, micro_batch=64, dp_rank=0, dp_size=8, seed=0)


# ---- chat data: the tokenizer's chat template, loss only on the assistant's tokens ---------------------------

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATS = [
    [{"role": "system", "content": "You answer about checkpoints."},
     {"role": "user", "content": "the cat saves the weights?"},
     {"role": "assistant", "content": "the checkpoint saves the weights."},
     {"role": "user", "content": "and the node?"},
     {"role": "assistant", "content": "a node shards its data."}],
    [{"role": "user", "content": "what resumes?"}, {"role": "assistant", "content": "our model resumes every step."}],
]


@pytest.fixture(scope="module")
def chat_shards(assets, tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("chat")
    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    tok.chat_template = CHATML
    tok.save_pretrained(root / "tokenizer")
    corpus = root / "chat.jsonl"
    corpus.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS * 40)
                      + json.dumps({"text": "plain text stays plain."}) + "\n")
    out = root / "data"
    index = prepare([corpus], str(root / "tokenizer"), out, shard_bytes=2048)
    return out, index, tok


def test_chat_records_are_formatted_with_the_chat_template_and_only_assistant_tokens_are_trained(chat_shards):
    out, index, tok = chat_shards
    assert index["loss_mask"] is True and all("mask" in s for s in index["shards"])
    ids = np.concatenate([np.fromfile(out / s["file"], dtype=np.uint16) for s in index["shards"]])
    mask = np.concatenate([np.fromfile(out / s["mask"], dtype=np.uint8) for s in index["shards"]])
    n = len(tok(tok.apply_chat_template(CHATS[0], tokenize=False), add_special_tokens=False)["input_ids"])
    assert tok.decode(ids[:n]) == tok.apply_chat_template(CHATS[0], tokenize=False)
    trained = tok.decode(ids[:n][mask[:n] == 1])
    # The assistant's words (and its end-of-turn marker) are trained; the system and user turns are not.
    assert "the checkpoint saves the weights.<|im_end|>" in trained and "a node shards its data." in trained
    assert "the cat saves" not in trained and "and the node" not in trained and "You answer" not in trained
    # The plain-text document at the end is trained on in full, EOS included.
    m = len(tok("plain text stays plain.", add_special_tokens=False)["input_ids"]) + 1
    assert tok.decode(ids[-m:]) == "plain text stays plain.<|endoftext|>" and mask[-m:].all()


def test_loader_labels_mask_the_prompt_and_the_model_loss_covers_only_assistant_tokens(chat_shards, assets):
    import torch
    from transformers import AutoModelForCausalLM

    out, _, _ = chat_shards
    loader = TokenShardLoader(out, seq_len=64, micro_batch=2, dp_rank=0, dp_size=1, seed=0)
    inputs = loader.next_inputs()
    labels, ids = inputs["labels"], inputs["input_ids"]
    assert ((labels == -100) | (labels == ids)).all() and (labels == -100).any() and (labels != -100).any()
    model = AutoModelForCausalLM.from_pretrained(assets["model"])
    with torch.no_grad():
        got = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
        logits = got.logits[:, :-1].reshape(-1, got.logits.shape[-1])
        target = torch.from_numpy(labels[:, 1:]).reshape(-1)
        keep = target != -100
        expected = torch.nn.functional.cross_entropy(logits[keep], target[keep])
        # A micro-batch of prompt only: a loss of 0 (no NaN to stop the run), and no gradient.
        prompt_only = model(input_ids=torch.from_numpy(ids), labels=torch.full_like(torch.from_numpy(ids), -100),
                            num_items_in_batch=torch.tensor(1))
    assert torch.allclose(got.loss, expected, rtol=1e-5)
    assert prompt_only.loss.item() == 0.0
    plain = TokenShardLoader(assets["data"], seq_len=64, micro_batch=2, dp_rank=0, dp_size=1, seed=0)
    both = plain.next_inputs()
    assert set(both) == {"input_ids", "labels"} and both["labels"] is both["input_ids"]  # plain text as before


def test_a_chat_template_whose_prefixes_differ_is_refused_as_are_chats_without_answers_or_template(chat_shards,
                                                                                                   tmp_path):
    _, _, tok = chat_shards
    tok.chat_template = "{{ messages|length }}:" + CHATML  # the count at the start changes with every prefix
    with pytest.raises(DataError, match="prefixes"):
        chat_tokens(tok, CHATS[1], "x.jsonl:1")
    tok.chat_template = CHATML
    tok.save_pretrained(tmp_path / "tok")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: no assistant message"):
        prepare([bad], str(tmp_path / "tok"), tmp_path / "out")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"messages": CHATS[1]}) + "\n")
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "plain-tok")
    with pytest.raises(DataError, match=r"good.jsonl:1: chat messages need a chat template.*a chat_template\.jinja "
                                        r"file beside the tokenizer"):  # where transformers saves one
        prepare([good], str(tmp_path / "plain-tok"), tmp_path / "out2")
    tok.chat_template = CHATML


def test_prepare_reports_progress_and_a_tokenizer_it_cannot_load_offline(assets, tmp_path, caplog):
    import logging
    import subprocess
    import sys

    with caplog.at_level(logging.INFO, logger="spotrun_trainer.data"):
        prepare([assets["corpus"]], str(assets["tokenizer"]), tmp_path / "p", progress_seconds=0)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepare: ")]
    assert len(progress) >= 100 and "documents" in progress[-1] and "tokens/s" in progress[-1]
    with pytest.raises(DataError, match=r"tokenizer='no-such/tokenizer' could not be loaded offline"):
        prepare([assets["corpus"]], "no-such/tokenizer", tmp_path / "q")
    res = subprocess.run([sys.executable, "-m", "spotrun_trainer", "prepare", str(assets["corpus"]), "--tokenizer",
                          "meta-llama/Llama-3.1-8B", "--out", str(tmp_path / "r")], capture_output=True, text=True,
                         timeout=120, check=False, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
                                                        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "could not be loaded offline" in res.stderr.strip().splitlines()[-1]


def test_the_trainer_fine_tunes_on_chat_shards_with_the_prompt_masked(chat_shards, assets, tmp_path):
    from tests.trainer.conftest import Job

    out, _, _ = chat_shards
    job = Job(tmp_path / "chat-job", {**assets, "data": out}, max_steps=6, log_every=2)
    assert job.run() == 0, job.text()[-3000:]
    losses = [json.loads(line)["loss"] for line in (job.output / "loss_history.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_the_validation_split_is_by_document_content_disjoint_stable_and_keeps_chat_masks(assets, tmp_path):
    from transformers import AutoTokenizer

    from spotrun_trainer.data import VALIDATION_DIR, validation_share

    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    tok.chat_template = CHATML
    tok.save_pretrained(tmp_path / "tok")
    chats = [[{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}."}]
             for i in range(60)]
    texts = [f"plain document number {i}." for i in range(60)]
    records = [{"messages": m} for m in chats] + [{"text": t} for t in texts]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))  # another order
    first = prepare([tmp_path / "a.jsonl"], str(tmp_path / "tok"), tmp_path / "one", validation_fraction=0.2)
    again = prepare([tmp_path / "b.jsonl"], str(tmp_path / "tok"), tmp_path / "two", validation_fraction=0.2)

    def decoded(data_dir) -> set[str]:
        index = read_index(data_dir)
        ids = np.concatenate([np.fromfile(data_dir / s["file"], dtype=index["dtype"]) for s in index["shards"]])
        return set(tok.decode(ids).split("<|endoftext|>")) - {""}

    held = [r for r in records if validation_share(r.get("messages") or r["text"]) < 0.2]
    assert 10 <= len(held) <= 40 and first["validation"] == {"dir": VALIDATION_DIR, "fraction": 0.2,
                                                             "documents": len(held)}
    val_one, train_one = decoded(tmp_path / "one" / VALIDATION_DIR), decoded(tmp_path / "one")
    assert val_one.isdisjoint(train_one) and len(val_one) == len(held) and len(train_one) == 120 - len(held)
    assert val_one == decoded(tmp_path / "two" / VALIDATION_DIR)  # the order of the input changes nothing
    assert again["validation"] == first["validation"]
    val_index = read_index(tmp_path / "one" / VALIDATION_DIR)
    assert any("messages" in r for r in held) and any("text" in r for r in held)
    assert val_index["loss_mask"] is True  # chat records keep their prompt masks in the validation set
    with pytest.raises(DataError, match="validation_fraction=1.5 is invalid"):
        prepare([tmp_path / "a.jsonl"], str(tmp_path / "tok"), tmp_path / "bad", validation_fraction=1.5)


def test_a_chat_turn_that_ends_with_the_eos_token_does_not_train_the_separator_after_its_markup(assets, tmp_path):
    # ChatML with eos_token <|im_end|> (Qwen2's instruct tokenizers): each conversation ends `<|im_end|>\n`, then the
    # packing's EOS. Training that EOS taught "\n -> <|im_end|>", and the generation prompt ends in that "\n": a
    # fine-tuned model (validation loss 6.3 -> 1.9) answered every chat prompt with an empty turn.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    tok.save_pretrained(tmp_path / "tokenizer")
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS * 3)
                      + json.dumps({"text": "plain text stays plain."}) + "\n")
    index = prepare([corpus], str(tmp_path / "tokenizer"), tmp_path / "data", shard_bytes=1 << 20)
    ids = np.concatenate([np.fromfile(tmp_path / "data" / s["file"], dtype=np.uint16) for s in index["shards"]])
    mask = np.concatenate([np.fromfile(tmp_path / "data" / s["mask"], dtype=np.uint8) for s in index["shards"]])
    eos, newline = tok.eos_token_id, tok("\n", add_special_tokens=False)["input_ids"]
    n = len(tok(tok.apply_chat_template(CHATS[0], tokenize=False), add_special_tokens=False)["input_ids"])
    assert ids[n] == eos and list(ids[n - len(newline):n]) == newline  # `<|im_end|>\n` then the separator
    assert mask[n] == 0  # the separator after the markup is not a target
    trained = tok.decode(ids[:n][mask[:n] == 1])
    assert trained.count("<|im_end|>") == 2  # each assistant turn still learns to stop at its own <|im_end|>
    assert ids[-1] == eos and mask[-1] == 1  # after plain text the EOS is still trained


def test_chat_sample_prompts_end_where_the_assistant_turn_begins(chat_shards, tmp_path):
    # the report's samples asked the model to continue a fixed window of the validation stream: mid-turn, often a
    # system prompt or the end of an answer, never a question as a user asks it
    from spotrun_trainer.samples import CHAT_CONTEXT, prompts

    _, _, tok = chat_shards
    tok.save_pretrained(tmp_path / "tokenizer")
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS * 20))
    prepare([corpus], str(tmp_path / "tokenizer"), tmp_path / "data", shard_bytes=1 << 20)
    # windows long enough to hold a turn's start (this tokenizer spells <|im_start|> in several tokens)
    asked, at_turns = prompts(tmp_path / "data", seq_len=256, count=3, prompt_tokens=8)
    assert at_turns and len(asked) == 3
    for ids in asked:
        assert tok.decode(ids).endswith("<|im_start|>assistant\n"), tok.decode(ids)
        assert 8 < len(ids) <= CHAT_CONTEXT * 8
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": f"plain text number {i} stays plain."}) + "\n" for i in range(60)))
    prepare([plain], str(tmp_path / "tokenizer"), tmp_path / "plain", shard_bytes=1 << 20)
    asked, at_turns = prompts(tmp_path / "plain", seq_len=64, count=3, prompt_tokens=8)
    assert not at_turns and [len(ids) for ids in asked] == [8, 8, 8]  # plain text: the first tokens, as before


def test_chat_sample_prompts_start_at_their_own_conversations_first_token(chat_shards, tmp_path):
    # a prompt was the CHAT_CONTEXT x prompt_tokens tokens before the turn: packed conversations are back to back,
    # so a short one was asked after the end of the one before it (its answer, the EOS, then the question)
    from spotrun_trainer.samples import prompts

    _, _, tok = chat_shards
    tok.save_pretrained(tmp_path / "tokenizer")
    chats = [*CHATS, [{"role": "user", "content": "short?"}, {"role": "assistant", "content": "yes."}]] * 20
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    index = prepare([corpus], str(tmp_path / "tokenizer"), tmp_path / "data", shard_bytes=4096)
    assert len(index["shards"]) > 1 and all("starts" in s for s in index["shards"])
    # every conversation's context up to each of its assistant turns, as the chat template renders it
    asked_as_a_user_would = {tok.apply_chat_template(m[:i], tokenize=False, add_generation_prompt=True)
                             for m in chats for i in range(len(m)) if m[i]["role"] == "assistant"}
    # this tokenizer spells text byte by byte: windows and context long enough to hold a turn and its conversation
    asked, at_turns = prompts(tmp_path / "data", seq_len=256, count=12, prompt_tokens=64)
    assert at_turns and len(asked) == 12
    for ids in asked:
        assert tok.decode(ids) in asked_as_a_user_would, tok.decode(ids)
    # a conversation longer than the context allowed keeps its own last tokens, never the one before it
    asked, _ = prompts(tmp_path / "data", seq_len=256, count=12, prompt_tokens=8)
    for ids in asked:
        text = tok.decode(ids)
        assert len(ids) == 32 and text.endswith("<|im_start|>assistant\n") and tok.eos_token not in text, text
