"""A hub id (``org/name``) loads offline from the user's HuggingFace cache, laid out as the hub
lays it out: ``models--org--name/refs/main`` holds the commit, ``snapshots/<commit>/`` links
each file to its content in ``blobs/``. The cache is the one the environment names when the
model is loaded (``HF_HUB_CACHE`` / ``HF_HOME``), and nothing reaches for the network."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest
import torch

import attnprobe as ap
from attnprobe.errors import ModelNotFoundError
from tests.integration.causal_lms import save_lm

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out_as_the_hub(saved: Path, hub: Path, repo_id: str) -> Path:
    """Put the files of ``saved`` in ``hub`` as ``hf download repo_id`` would; the snapshot
    folder."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)  # the hub writes the hash, no newline
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in sorted(saved.iterdir()):
        content = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    save_lm("llama", folder)
    return folder


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to open a connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"loading tried the network: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_hub_id_loads_from_the_cache_the_environment_names(saved, tmp_path, monkeypatch,
                                                            offline, variable):
    hub = tmp_path / "hub"
    snapshot = lay_out_as_the_hub(saved, hub, "org/tiny")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, str(hub if variable == "HF_HUB_CACHE" else tmp_path))
    assert ap.loading.hub_snapshot("org/tiny") == snapshot
    model, tokenizer = ap.load_model("org/tiny")
    direct, direct_tokenizer = ap.load_model(str(saved))
    assert type(model) is type(direct)
    theirs = direct.state_dict()
    assert all(torch.equal(value, theirs[key]) for key, value in model.state_dict().items())
    assert tokenizer("w5 w6")["input_ids"] == direct_tokenizer("w5 w6")["input_ids"]


def test_an_id_not_in_the_cache_says_how_to_fetch_it(saved, tmp_path, monkeypatch, offline):
    hub = tmp_path / "hub"
    lay_out_as_the_hub(saved, hub, "org/tiny")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(ModelNotFoundError) as found:
        ap.load_model("org/absent")
    message = str(found.value)
    assert "\n" not in message
    assert "hf download org/absent" in message and str(hub) in message
