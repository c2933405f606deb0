"""The real-engine fixture's own pieces (sidecar/devstack/engine/): the tiny model is the
same bytes for the same seed and writes only well-formed text; the build is found in the
cache without building, and without a compiler it is unavailable (a loud skip), not a
failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.devstack.engine import llama_build, tiny_model


def test_the_tiny_model_is_deterministic_and_its_metadata_is_what_llama_cpp_reads(
        tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    first = tiny_model.write_tiny_model(tmp_path / "a.gguf")
    second = tiny_model.write_tiny_model(tmp_path / "b.gguf")
    assert first.read_bytes() == second.read_bytes()
    assert tiny_model.write_tiny_model(tmp_path / "c.gguf", seed=1).read_bytes() != \
        first.read_bytes()
    reader = gguf.GGUFReader(str(first))
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "llama"
    assert "<tool_call>" in bytes(fields["tokenizer.chat_template"].parts[-1]).decode()
    names = {tensor.name for tensor in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names


def test_only_printable_text_can_be_sampled() -> None:
    tokens, types, _ = tiny_model.vocabulary()
    allowed = {token for token, ok in zip(tokens, tiny_model._sampled(tokens, types),
                                      strict=True)
               if ok}
    assert "<0x41>" in allowed and "<0x0A>" in allowed and "\u2581the" in allowed
    assert not {"<0x80>", "<0xFF>", "<0x00>", "<|im_end|>", "<s>", "<unk>"} & allowed


def test_a_cached_build_is_found_without_building(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_ENGINE_CACHE", str(tmp_path))
    folder = llama_build.engine_dir("9.9.9")
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "llama-server").write_text("")
    (folder / "build.json").write_text(json.dumps({"build_seconds": 171.5}))
    monkeypatch.setattr(llama_build, "_build", lambda *a: pytest.fail("built again"))
    engine = llama_build.ensure_llama_server("9.9.9")
    assert (engine.binary, engine.build_seconds, engine.built_now) == (
        folder / "bin" / "llama-server", 171.5, False)


def test_without_a_compiler_the_engine_is_unavailable(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_ENGINE_CACHE", str(tmp_path))
    monkeypatch.setattr(llama_build.shutil, "which",
                        lambda name: None if name in ("c++", "g++", "clang++") else "/x")
    with pytest.raises(llama_build.EngineUnavailable, match="C\\+\\+ compiler"):
        llama_build.ensure_llama_server("9.9.9")


def test_the_cache_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SIDECAR_ENGINE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = llama_build.engine_dir("0.3.36")
    assert folder.parent == tmp_path / "model-group-sidecar"
    assert folder.name.startswith("llama.cpp-0.3.36-")


def test_other_build_options_are_another_cache_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached binary built with other options is never taken for this build's."""
    before = llama_build.engine_dir("0.3.36")
    monkeypatch.setattr(llama_build, "CMAKE_OPTIONS", (*llama_build.CMAKE_OPTIONS, "-DX=1"))
    assert llama_build.engine_dir("0.3.36") != before


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_engine_tests_run_last_and_the_others_keep_their_order() -> None:
    from tests import engine_prebuild
    names = ["tests/unit/test_a.py::x", "tests/e2e/engine/test_b.py::y",
             "tests/e2e/test_c.py::z", "tests/e2e/engine/test_d.py::w", "tests/unit/e.py::v"]
    items = [_Item(name) for name in names]
    engine_prebuild.engine_tests_last(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [names[0], names[2], names[4], names[1],
                                                names[3]]


def test_a_session_without_engine_tests_or_with_a_cached_engine_builds_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import engine_prebuild
    monkeypatch.setenv("SIDECAR_ENGINE_CACHE", str(tmp_path))
    monkeypatch.setattr(engine_prebuild.subprocess, "Popen",
                        lambda *a, **k: pytest.fail("a build was started"))
    assert engine_prebuild.start_build([_Item("tests/unit/test_a.py::x")]) is None  # type: ignore[list-item]
    folder = llama_build.engine_dir()
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "llama-server").write_text("")
    (folder / "build.json").write_text("{}")
    assert engine_prebuild.start_build(  # type: ignore[arg-type]
        [_Item("tests/e2e/engine/test_b.py::y")]) is None
