"""Fixtures shared across test packages. Nothing here may reach AWS: fake credentials, moto stands in."""

import os

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

import pytest  # noqa: E402

from spotrun.local.examples import build_example  # noqa: E402


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> dict:
    """A tiny corpus, BPE tokenizer, Llama/GPT-2/Qwen2 model dirs and prepared shards, built once."""
    root = tmp_path_factory.mktemp("assets")
    paths = build_example(root, "llama")
    from transformers import AutoTokenizer

    from spotrun.local.examples import save_tiny_model

    vocab = len(AutoTokenizer.from_pretrained(paths["tokenizer"]))
    paths["model-gpt2"] = save_tiny_model("gpt2", root / "model-gpt2", vocab_size=vocab,
                                          tokenizer_dir=paths["tokenizer"])
    paths["model-qwen2"] = save_tiny_model("qwen2", root / "model-qwen2", vocab_size=vocab,
                                           tokenizer_dir=paths["tokenizer"])
    return paths
