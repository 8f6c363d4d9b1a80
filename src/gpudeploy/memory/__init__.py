"""The startup-memory model of SGLang: will a server boot on this GPU, how sure is that, what would.

Pure: no network, no host, no store (the only I/O is :func:`modelfacts.model_facts_from_dir`
reading a model directory's ``config.json``). ``gpudeploy.plan`` calls it for each unit; deploy
feeds back what a run logged (:mod:`.logparse`).
"""

from __future__ import annotations

from .budget import CERTAIN, SEVERITIES, VERDICTS, Budget
from .logparse import Measured, parse_memory_log
from .modelfacts import ModelFacts, model_facts_from_dir, model_facts_from_mapping
from .recommend import Suggestion, budget, recommendation_flags, suggest
from .releases import Release, release_rules
from .settings import EngineSettings

__all__ = ["CERTAIN", "SEVERITIES", "VERDICTS", "Budget", "EngineSettings", "Measured", "ModelFacts", "Release",
           "Suggestion", "budget", "model_facts_from_dir", "model_facts_from_mapping", "parse_memory_log",
           "recommendation_flags", "release_rules", "suggest"]
