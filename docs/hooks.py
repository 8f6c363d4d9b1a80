"""mkdocs hooks: the benchmark results folder in the site.

The plots and data of ``bench/results/`` stay beside the benchmarks that write them, and the pages
link them as ``../bench/results/...``, a path that works where the pages are read as files (on
GitHub, in an editor). mkdocs only publishes what is under ``docs/``, and would call such a link
broken (``--strict`` fails on it): so the folder is added to the site as ``bench/results/``, and
those links are rewritten to point there. A link to a file that is not in the folder stays broken,
and ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "bench/results"
# the parts of a link target that reach the repository's top from the page: "../" once per folder
# level of the page, plus one for docs/ itself
_LINK = re.compile(r"\]\(((?:\.\./)+)" + re.escape(RESULTS) + "/")


def on_files(files: Files, config: Any) -> Files:
    for path in sorted((ROOT / RESULTS).rglob("*")):
        if path.is_file():
            files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = page.file.src_uri.count("/")
    if page.file.src_uri.startswith(RESULTS + "/"):
        return markdown  # the folder's own pages link its files by their plain names

    def site_link(m: re.Match[str]) -> str:
        if len(m.group(1)) // 3 != depth + 1:
            return m.group(0)  # not a path to the repository's top from this page: leave it to mkdocs
        return "](" + "../" * depth + RESULTS + "/"

    return _LINK.sub(site_link, markdown)
