"""Step checkpoints: safetensors + JSON sidecar, atomic commit, checksum fallback, retention, no pickle."""
from __future__ import annotations

import json
import logging
import struct

import pytest
import torch
from safetensors import safe_open

from data.fileio import file_digest
from training import checkpoints


def _trained_state(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    for _ in range(3):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    scheduler.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "epoch": 1, "rng": [{"torch": "abc", "python": [3, (1, 2), None]}]}
    return model, optimizer, state


def _save_steps(directory, steps, keep=10):
    _, _, state = _trained_state()
    for step in steps:
        checkpoints.save(directory, step, {**state, "step": step}, keep=keep)


def test_round_trip_restores_model_optimizer_and_scalars(tmp_path):
    model, optimizer, state = _trained_state()
    sidecar = checkpoints.save(tmp_path, 3, state, keep=2)
    assert sidecar == tmp_path / "ckpt-00000003.json"

    loaded = checkpoints.load(tmp_path, 3)
    assert loaded["epoch"] == 1 and loaded["rng"] == [{"torch": "abc", "python": [3, [1, 2], None]}]
    assert loaded["scheduler"] == state["scheduler"]
    fresh, fresh_optimizer, _ = _trained_state(seed=1)
    fresh.load_state_dict(loaded["model"])
    fresh_optimizer.load_state_dict(loaded["optimizer"])
    batch = torch.randn(8, 4)
    for m, opt in ((model, optimizer), (fresh, fresh_optimizer)):
        m(batch).pow(2).mean().backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_sidecar_records_checksum_and_versions(tmp_path):
    _save_steps(tmp_path, [7])
    sidecar = json.loads((tmp_path / "ckpt-00000007.json").read_text())
    assert sidecar["step"] == 7
    assert sidecar["tensors_file"] == "ckpt-00000007.safetensors"
    assert sidecar["sha256"] == file_digest(tmp_path / "ckpt-00000007.safetensors")
    assert sidecar["torch_version"] == torch.__version__
    assert sidecar["state"]["optimizer"]["param_groups"][0]["lr"] == pytest.approx(5e-3)


def test_tensors_without_a_sidecar_are_not_a_checkpoint(tmp_path):
    _save_steps(tmp_path, [10])
    (tmp_path / "ckpt-00000020.safetensors").write_bytes(b"half a checkpoint, crashed before its sidecar")
    assert checkpoints.committed_steps(tmp_path) == [10]
    assert checkpoints.latest_good(tmp_path) == 10


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "garble_sidecar"])
def test_latest_good_falls_back_past_a_damaged_newest_checkpoint(tmp_path, caplog, damage):
    _save_steps(tmp_path, [10, 20])
    tensors, sidecar = tmp_path / "ckpt-00000020.safetensors", tmp_path / "ckpt-00000020.json"
    data = tensors.read_bytes()
    if damage == "truncate":
        tensors.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        tensors.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "delete":
        tensors.unlink()
    else:
        sidecar.write_text('{"step": 20, "sha2')
    with caplog.at_level(logging.WARNING, logger="training.checkpoints"):
        assert checkpoints.latest_good(tmp_path) == 10
    assert "skipping checkpoint step 20" in caplog.text and "ckpt-00000020" in caplog.text
    with pytest.raises(checkpoints.CheckpointError, match="ckpt-00000020"):
        checkpoints.load(tmp_path, 20)
    assert checkpoints.load(tmp_path, 10)["step"] == 10


def test_no_good_checkpoint_means_none(tmp_path):
    assert checkpoints.latest_good(tmp_path / "missing") is None
    _save_steps(tmp_path, [5])
    (tmp_path / "ckpt-00000005.safetensors").write_bytes(b"")
    assert checkpoints.latest_good(tmp_path) is None


def test_keeps_the_newest_n_and_removes_orphans(tmp_path):
    _save_steps(tmp_path, [1, 2, 3], keep=10)
    (tmp_path / "ckpt-00000004.safetensors").write_bytes(b"orphan of a crashed save")
    _save_steps(tmp_path, [5, 6], keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000005.json", "ckpt-00000005.safetensors", "ckpt-00000006.json", "ckpt-00000006.safetensors"]


def test_stale_temp_files_go_on_the_next_save_and_other_files_stay(tmp_path):
    stale = [tmp_path / ".ckpt-00000003.safetensors.k2j3h4.tmp", tmp_path / ".ckpt-00000003.json.x9.tmp"]
    for path in stale:
        path.write_bytes(b"partial write of a killed process")
    (tmp_path / "notes.txt").write_text("not ours")
    _save_steps(tmp_path, [4], keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000004.json", "ckpt-00000004.safetensors",
                                                          "notes.txt"]


def test_a_failed_save_leaves_the_previous_checkpoint_untouched(tmp_path):
    _save_steps(tmp_path, [1])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="'extra/sampler' is a Generator"):
        checkpoints.save(tmp_path, 2, {"extra": {"sampler": torch.Generator()}}, keep=2)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_files_are_safetensors_and_json_only(tmp_path):
    _save_steps(tmp_path, [9])
    tensors = tmp_path / "ckpt-00000009.safetensors"
    data = tensors.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    assert "model/0.weight" in header and "optimizer/state/0/exp_avg" in header
    with safe_open(tensors, framework="pt") as f:
        assert f.get_tensor("optimizer/state/0/step").shape == ()
    json.loads((tmp_path / "ckpt-00000009.json").read_text())
    assert not data.startswith((b"\x80", b"PK")), "neither a pickle nor a torch.save zip"
