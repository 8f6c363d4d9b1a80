"""The lab's engine recipes (vLLM, sglang-router): one build path, keys, symlinks, stale builds. No build."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudeploy_lab import engine


def test_recipes_have_distinct_keys_and_the_vllm_key_is_the_one_before_recipes() -> None:
    # The vLLM build cached before recipes existed keeps its key: changing it means a 3-minute rebuild.
    assert engine.VLLM.key() == engine.cache_key() == "6431c0c27e108692"
    assert engine.ROUTER.key() != engine.VLLM.key()
    assert engine.ROUTER.packages == ("sglang-router==0.3.2",)
    assert engine.ROUTER.model_script is None and engine.ROUTER.uninstall == ()
    assert engine.ROUTER.guest_python == "/opt/gpudeploy/engines/router/venv/bin/python3"
    assert engine.GUEST_PYTHON == "/opt/gpudeploy/engines/vllm/venv/bin/python3"
    assert engine.GUEST_MODEL == "/opt/gpudeploy/engines/vllm/model"
    assert engine.ROUTER.base_dir.name == f"router-{engine.ROUTER.key()}"


def test_stale_builds_are_removed_per_recipe_and_the_link_is_relative(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "ENGINES_DIR", tmp_path)
    for name in ("router-0000000000000000", "router-1111111111111111", "vllm-2222222222222222",
                 engine.ROUTER.base_dir.name, engine.VLLM.base_dir.name):
        (tmp_path / name).mkdir()
    removed = engine.remove_stale(engine.ROUTER)
    assert sorted(p.name for p in removed) == ["router-0000000000000000", "router-1111111111111111"]
    assert (tmp_path / "vllm-2222222222222222").is_dir()  # another recipe's build is not touched
    engine._link_current(engine.ROUTER)
    assert (tmp_path / "router").readlink() == Path(engine.ROUTER.base_dir.name)
    assert engine.ROUTER.python == tmp_path / "router/venv/bin/python3"
    assert not engine.ROUTER.is_built()
    (engine.ROUTER.base_dir / ".complete").write_text("{}\n")
    assert engine.ROUTER.is_built()
    assert engine.ensure(engine.ROUTER, log=False) == engine.ROUTER.base_dir  # cached: no pip
    assert engine.bind_mount() == (tmp_path, "/opt/gpudeploy/engines")
