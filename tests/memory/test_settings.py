"""EngineSettings from role settings: canonical names, release spellings, bad values."""

from __future__ import annotations

import pytest

from gpudeploy.errors import InputError
from gpudeploy.memory.defaults import capture_batch_sizes
from gpudeploy.memory.hybrid import slots_per_request as mamba_slots_per_request
from gpudeploy.memory.releases import release_rules
from gpudeploy.memory.settings import EngineSettings


def test_canonical_and_release_names() -> None:
    s = EngineSettings.from_settings({"mem_fraction_static": 0.7, "cuda-graph-max-bs-decode": 16,
                                      "mamba_radix_cache_strategy": "extra_buffer",
                                      "speculative_algorithm": "nextn", "host": "0.0.0.0"}, tp_size=4)
    assert (s.tp_size, s.mem_fraction_static, s.cuda_graph_max_bs) == (4, 0.7, 16)
    assert s.mamba_scheduler_strategy == "extra_buffer"
    assert s.speculative_algorithm == "EAGLE"   # NEXTN becomes EAGLE
    assert s.spec() == (3, 1, 4)                 # SGLang-style defaults when only the algorithm is set


@pytest.mark.parametrize(("settings", "key"), [
    ({"mem_fraction_static": 1.2}, "mem_fraction_static"),
    ({"mem_fraction_static": "high"}, "mem_fraction_static"),
    ({"cuda_graph_max_bs": -4}, "cuda_graph_max_bs"),
    ({"max_running_requests": 0}, "max_running_requests"),
    ({"speculative_algorithm": "MEDUSA"}, "speculative_algorithm"),
    ({"mamba_scheduler_strategy": "big"}, "mamba_scheduler_strategy"),
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
])
def test_bad_settings(settings: dict[str, object], key: str) -> None:
    with pytest.raises(InputError) as e:
        EngineSettings.from_settings(settings, tp_size=1, where="roles/decode.yaml")
    assert e.value.problems[0].key == key
    assert e.value.problems[0].file == "roles/decode.yaml"


def test_capture_sizes_and_mamba_slots() -> None:
    assert capture_batch_sizes(16, False) == [1, 2, 4, 8, 12, 16]
    assert max(capture_batch_sizes(512, False)) == 512
    assert capture_batch_sizes(16, True)[-1] == 16
    old, new = release_rules("0.5.9"), release_rules("0.5.23")
    assert mamba_slots_per_request(EngineSettings(), old) == 3          # auto is no_buffer up to 0.5.10
    assert mamba_slots_per_request(EngineSettings(), new) == 5          # and extra_buffer in 0.5.23
    assert mamba_slots_per_request(EngineSettings(mamba_scheduler_strategy="extra_buffer"), old) == 5
    assert mamba_slots_per_request(EngineSettings(mamba_scheduler_strategy="extra_buffer_lazy"), new) == 4
    assert mamba_slots_per_request(EngineSettings(disable_radix_cache=True), old) == 1
    # no_buffer with speculative decoding turns the radix cache off: one slot per request
    spec = EngineSettings(mamba_scheduler_strategy="no_buffer", speculative_algorithm="EAGLE")
    assert mamba_slots_per_request(spec, old) == 1
    # extra_buffer with speculative decoding: overlap off up to 0.5.10 (+1), kept in 0.5.23 (+2)
    eb = EngineSettings(mamba_scheduler_strategy="extra_buffer", speculative_algorithm="EAGLE")
    assert (mamba_slots_per_request(eb, old), mamba_slots_per_request(eb, new)) == (4, 5)
