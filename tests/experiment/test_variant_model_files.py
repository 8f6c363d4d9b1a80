"""Experiments vary what the field varied by hand (issue 25): the checkpoint (model.path, with its own
facts for the memory preflight) and files shipped with a variant (tuned MoE configs uploaded to the
host, whole or not at all, and pointed at by env); --dry-run shows every variant's memory verdict."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from fakelab import FakeLab
from test_experiment_file import invoke, write

from gpudeploy.errors import InputError
from gpudeploy.experiment import bench, ship
from gpudeploy.experiment.runner import dry_run_lines, run_experiment
from gpudeploy.experiment.spec import key_of, load_experiment
from gpudeploy.experiment.variants import plan_variants

FP4 = {"kind": "mha", "weights_gib": 120.0, "layers": 94, "kv_heads": 4, "head_dim": 128, "hidden_size": 4096,
       "vocab_size": 151936, "moe_intermediate_size": 1536, "num_experts_per_tok": 8, "context_length": 40960}


def moe_configs(tmp_path: Path) -> Path:
    folder = tmp_path / "tuned" / "configs" / "triton_3_4_0"
    folder.mkdir(parents=True)
    (folder / "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8.json").write_text('{"1": {"BLOCK_SIZE_M": 16}}\n')
    (folder / "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json").write_text('{"1": {"BLOCK_SIZE_M": 32}}\n')
    return tmp_path / "tuned"


def two_checkpoints(tmp_path: Path) -> Path:
    moe_configs(tmp_path)
    (tmp_path / "sampling.json").write_text('{"temperature": 0.6}\n')
    facts = "{" + ", ".join(f"{k}: {v}" for k, v in FP4.items()) + "}"
    return write(tmp_path, f"""\
variants:
  fp8: {{}}
  fp4:
    prefill: {{model: {{path: /models/Qwen3-235B-A22B-FP4, facts: {facts}}}}}
    decode:
      model: {{path: /models/Qwen3-235B-A22B-FP4, facts: {facts}}}
      files: {{SGLANG_MOE_CONFIG_DIR: tuned, SGLANG_GEN_CONFIG: sampling.json}}
benchmark: {{concurrency: [1], prompts: 8}}
""")


def test_a_variant_serves_another_checkpoint_with_its_own_facts(tmp_path: Path) -> None:
    exp = load_experiment(two_checkpoints(tmp_path))
    fp8, fp4 = plan_variants(exp)
    for p, path in ((fp8, "/models/Qwen3-235B-A22B-FP8"), (fp4, "/models/Qwen3-235B-A22B-FP4")):
        for u in (u for u in p.plan.units if u.role.engine == "sglang"):
            assert u.argv[u.argv.index("--model-path") + 1] == path
    dec8 = next(u for u in fp8.plan.units if u.role.name == "decode")
    dec4 = next(u for u in fp4.plan.units if u.role.name == "decode")
    assert dec8.memory and dec4.memory
    assert dec4.memory["weights_gib"] < dec8.memory["weights_gib"]  # its own facts: 120 GiB over 4, not 219.8
    # the client's tokenizer follows the checkpoint
    assert bench.target(exp, fp4.plan).tokenizer == "/models/Qwen3-235B-A22B-FP4"


def test_a_new_path_without_facts_drops_the_old_checkpoints(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, """\
variants:
  other: {decode: {model: {path: /models/unreadable-here}}, prefill: {model: {path: /models/unreadable-here}}}
benchmark: {concurrency: [1]}
"""))
    (other,) = plan_variants(exp)
    dec = next(u for u in other.plan.units if u.role.name == "decode")
    assert dec.memory is not None and dec.memory["verdict"] == "unknown"  # not the FP8 facts of the role file
    assert "facts" not in dec.role.model


def test_shipped_files_are_pointed_at_by_env_and_part_of_the_variants_key(tmp_path: Path) -> None:
    path = two_checkpoints(tmp_path)
    exp = load_experiment(path)
    fp4 = exp.variants[1]
    (gen, moe) = sorted(fp4.shipped["decode"], key=lambda b: b.env)
    assert moe.env == "SGLANG_MOE_CONFIG_DIR" and not moe.single and len(moe.files) == 2
    assert moe.files[0][0] == "configs/triton_3_4_0/E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    assert gen.single and gen.target == f"{ship.SHIPPED_ROOT}/{gen.digest}/sampling.json"
    planned = plan_variants(exp)[1]
    dec = next(u for u in planned.plan.units if u.role.name == "decode")
    assert dec.env["SGLANG_MOE_CONFIG_DIR"] == f"{ship.SHIPPED_ROOT}/{moe.digest}"
    assert dec.env["SGLANG_GEN_CONFIG"] == gen.target
    assert "SGLANG_MOE_CONFIG_DIR" not in next(u for u in planned.plan.units if u.role.name == "prefill").env
    assert [(h.name, b.env) for h, b in planned.shipped] == [("node171", "SGLANG_MOE_CONFIG_DIR"),
                                                            ("node171", "SGLANG_GEN_CONFIG")]
    summary = fp4.overrides["decode"]["files"]["SGLANG_MOE_CONFIG_DIR"]
    assert summary == {"source": "tuned", "sha256": moe.digest, "files": 2, "bytes": moe.size}
    before = key_of(exp, fp4)
    (tmp_path / "sampling.json").write_text('{"temperature": 0.7}\n')  # an edited file: another variant
    assert key_of(load_experiment(path), load_experiment(path).variants[1]) != before


def test_what_cannot_be_shipped_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    path = write(tmp_path, """\
variants:
  a:
    decode:
      files:
        GONE: no/such/folder
        LINKED: link.json
        CUDA_VISIBLE_DEVICES: real.json
        BOTH: real.json
      env: {BOTH: "1"}
  b: {decode: {model: {path: ""}}}
benchmark: {concurrency: [1]}
""")
    with pytest.raises(InputError) as err:
        load_experiment(path)
    text = str(err.value)
    # (write() puts the inventory and results lines first: the variants start at line 3)
    assert f"{path}:7: role decode, key variants.a.decode.files.GONE: cannot read {tmp_path / 'no/such/folder'}" in text
    assert f"{path}:8: role decode, key variants.a.decode.files.LINKED: {tmp_path / 'link.json'} is a symlink" in text
    assert f"{path}:9: role decode, key variants.a.decode.files.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set" \
        in text
    assert f"{path}:10: role decode, key variants.a.decode.files.BOTH: BOTH is set by env too" in text
    assert "key variants.b.decode.model.path: must not be empty" in text
    assert len(err.value.problems) == 5, text


def test_the_upload_is_whole_or_nothing_and_once_per_content(tmp_path: Path) -> None:
    bundle = ship.read_bundle("SGLANG_MOE_CONFIG_DIR", "tuned", moe_configs(tmp_path).parent)
    assert isinstance(bundle, ship.Bundle)
    root, final = tmp_path / "host" / "shipped", tmp_path / "host" / "shipped" / bundle.digest

    def unpack(data: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["sh", "-c", ship.UNPACK, "unpack", str(root), str(final)], input=data,
                              capture_output=True, timeout=30)

    broken = ship.tar_bytes(bundle)[:1500]  # the connection dropped mid-stream
    res = unpack(broken)
    assert res.returncode != 0 and not final.exists() and list(root.iterdir()) == []  # nothing, not half
    res = unpack(ship.tar_bytes(bundle))
    assert res.returncode == 0, res.stderr
    got = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
    assert got == [rel for rel, _ in bundle.files]
    assert all((final / rel).read_bytes() == data for rel, data in bundle.files)
    assert oct(final.stat().st_mode & 0o777) == "0o755"
    assert all(oct((final / rel).stat().st_mode & 0o777) == "0o644" for rel, _ in bundle.files)
    assert [p.name for p in root.iterdir()] == [bundle.digest]  # no temporary folder left
    again = unpack(b"not a tar at all")  # the same digest is there already: nothing is unpacked
    assert again.returncode == 0 and sorted(p.name for p in root.iterdir()) == [bundle.digest]
    with tarfile.open(fileobj=io.BytesIO(ship.tar_bytes(bundle))) as tar:
        assert all((not m.name.startswith(("/", "..")) and m.isfile()) or m.isdir() for m in tar.getmembers())


def test_dry_run_shows_every_variants_memory_verdict_and_what_it_ships(tmp_path: Path) -> None:
    path = two_checkpoints(tmp_path)
    path.write_text(path.read_text().replace("  fp8: {}\n", "  fp8: {}\n  tiny-pool: {decode: {settings: "
                                                           "{mem_fraction_static: 0.01}}}\n"))
    exp = load_experiment(path)
    planned = plan_variants(exp)
    text = "\n".join(dry_run_lines(exp, planned, {p.variant.name: bench.target(exp, p.plan) for p in planned}, None))
    blocks = {b.split(":", 1)[0]: b for b in text.split("== ")[1:]}
    assert set(blocks) == {"fp8", "tiny-pool", "fp4"}
    for name, block in blocks.items():
        for unit in ("node171/prefill", "node171/decode"):
            assert f"memory {unit}: " in block, (name, block)
    assert "memory node171/decode: FITS" in blocks["fp8"]
    assert "SKIP" in blocks["tiny-pool"] and "memory node171/decode: " in blocks["tiny-pool"]
    assert "(deploy refuses)" in blocks["tiny-pool"]
    # its empty KV pool leaves a large "available" headroom: no margin that reads as fine (issue 45)
    refused = next(ln for ln in blocks["tiny-pool"].splitlines() if "memory node171/decode: " in ln)
    assert "KV-POOL-EMPTY (deploy refuses)" in refused and "margin" not in refused, refused
    assert "headroom margin +" in next(ln for ln in blocks["fp8"].splitlines() if "memory node171/decode: " in ln)
    digest = next(b for b in exp.variants[2].shipped["decode"] if b.env == "SGLANG_MOE_CONFIG_DIR").digest
    assert ("ships tuned (2 files, " in blocks["fp4"]
            and f"to node171:{ship.SHIPPED_ROOT}/{digest}, SGLANG_MOE_CONFIG_DIR={ship.SHIPPED_ROOT}/{digest}"
            in blocks["fp4"]), blocks["fp4"]
    res = invoke("experiment", "--file", str(path), "--dry-run")  # the command prints the same
    assert res.returncode == 0 and "memory node171/decode: FITS" in res.stdout, res.stdout + res.stderr


def test_the_files_reach_the_host_before_the_variant_deploys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = FakeLab(monkeypatch)
    order: list[str] = []
    lab.on_command = lambda argv: order.append("unpack" if argv[:2] == ["sh", "-c"] and argv[2] == ship.UNPACK
                                               else "other")
    deploy = lab.deploy

    def recording_deploy(*args: object, **kwargs: object) -> object:
        order.append("deploy")
        return deploy(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("gpudeploy.experiment.runner.deploy", recording_deploy)
    store = run_experiment(load_experiment(two_checkpoints(tmp_path)), say=lab.say)
    assert {v["name"]: v["status"] for v in store.current()} == {"fp8": "measured", "fp4": "measured"}
    fp8_deploy, fp4_deploy = (i for i, what in enumerate(order) if what == "deploy")
    assert order[:fp8_deploy].count("unpack") == 0  # fp8 ships nothing
    assert order[fp8_deploy:fp4_deploy].count("unpack") == 2  # both of fp4's bundles, before its deploy
    assert "shipped tuned (2 files) to node171:" in lab.out
    units = {u["role"]: u for u in next(v for v in store.current() if v["name"] == "fp4")["units"]}
    assert units["decode"]["env"]["SGLANG_MOE_CONFIG_DIR"].startswith(ship.SHIPPED_ROOT + "/")


def test_a_grid_over_checkpoints(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, """\
grid:
  decode.model.path: [/models/a, /models/b]
benchmark: {concurrency: [1]}
"""))
    assert [v.overrides for v in exp.variants] == [{"decode": {"model": {"path": "/models/a"}}},
                                                   {"decode": {"model": {"path": "/models/b"}}}]
