"""Fixtures shared across test packages: the tiny assets, one synth of the whole app (the infrastructure tests read
its template, the image tests build its staged trainer asset). Nothing here may reach AWS: fake credentials, moto
stands in."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

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


@dataclass
class Synth:
    outdir: Path
    template: dict
    template_path: Path

    def resources(self, cfn_type: str) -> dict[str, dict]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == cfn_type}

    def one(self, cfn_type: str) -> tuple[str, dict]:
        found = self.resources(cfn_type)
        assert len(found) == 1, (cfn_type, list(found))
        return next(iter(found.items()))


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Synth:
    from app import build_app

    outdir = tmp_path_factory.mktemp("cdk.out")
    build_app(outdir=str(outdir)).synth()  # raises if cdk-nag reports any unacknowledged finding
    path = next((outdir / "assembly-dev").glob("*.template.json"))
    return Synth(outdir=outdir, template=json.loads(path.read_text()), template_path=path)


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    """No AWS credentials anywhere (an S3 read fails as NoCredentialsError), and no request could leave: no
    instance metadata call, any endpoint a closed loopback port, boto3's cached default session dropped."""
    import boto3

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # an earlier test's session caches its credentials
