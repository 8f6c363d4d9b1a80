"""The results store: one SQLite file (stdlib ``sqlite3``) and the client's raw files, in the results folder.

    <results>/experiment.sqlite        variants (one row each) and runs (variant x concurrency x repeat)
    <results>/raw/<variant>/c<C>-r<R>.json   the client's own result file, byte for byte
    <results>/raw/<variant>/c<C>-r<R>.log    what the client printed

Every change is one transaction, so a Ctrl-C (or a crash) leaves either the run recorded with its raw
file or not recorded at all; a variant is ``running`` until its outcome is written, which ``--resume``
reads as "not finished".
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS variants (
    name TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    status TEXT NOT NULL,            -- running | measured | skipped | deploy-failed | failed-under-load | interrupted
    overrides TEXT NOT NULL,         -- JSON: role -> overrides
    grid TEXT NOT NULL,              -- JSON: [[dimension, value], ...]
    verdict TEXT,                    -- the memory preflight's, for a skipped variant; else its warnings
    saved_s REAL,                    -- a skipped variant: the deploy it did not have to try
    failure TEXT,                    -- deploy-failed / failed-under-load: what happened, with the cause
    units TEXT,                      -- JSON: [{host, role, unit, argv, env}] as rendered
    engine TEXT,                     -- sglang | vllm
    engine_release TEXT,
    memory TEXT,                     -- JSON: the memory figures the engines logged at start
    client TEXT,
    synthetic INTEGER NOT NULL DEFAULT 0,
    gpus INTEGER,
    deploy_s REAL,
    started REAL,
    finished REAL
);
CREATE TABLE IF NOT EXISTS runs (
    variant TEXT NOT NULL REFERENCES variants(name),
    concurrency INTEGER NOT NULL,
    repeat INTEGER NOT NULL,
    ok INTEGER NOT NULL,             -- the client finished and wrote its result
    failed_under_load TEXT,          -- an engine died during this run: its cause
    argv TEXT NOT NULL,              -- JSON: the client's argv as run
    raw_file TEXT,                   -- relative to the results folder
    figures TEXT,                    -- JSON: bench.figures() of the raw file
    started REAL NOT NULL,
    wall_s REAL NOT NULL,
    PRIMARY KEY (variant, concurrency, repeat)
);
"""

# What --resume does not run again. A failed deploy is run again: its cause may have been the host
# (a timeout on a loaded machine, a host that did not answer), not the variant.
FINISHED = ("measured", "skipped", "failed-under-load")


@dataclass(frozen=True)
class RunRow:
    variant: str
    concurrency: int
    repeat: int
    ok: bool
    failed_under_load: str | None
    argv: list[str]
    raw_file: str | None
    figures: dict[str, Any]
    started: float
    wall_s: float


class Store:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "experiment.sqlite"

    def exists(self) -> bool:
        return self.path.is_file()

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        self.folder.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            conn.executescript(SCHEMA)
            yield conn
        finally:
            conn.close()

    # ------------------------------------------------------------------------------------ writes

    def set_meta(self, **values: Any) -> None:
        with self.connect() as conn, conn:
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             [(k, json.dumps(v)) for k, v in values.items()])

    def begin_variant(self, name: str, position: int, overrides: dict[str, Any], grid: list[Any]) -> None:
        """Mark ``name`` running (keeping the runs it already has: a resumed variant reuses them)."""
        with self.connect() as conn, conn:
            conn.execute("INSERT INTO variants (name, position, status, overrides, grid, started) "
                         "VALUES (?, ?, 'running', ?, ?, ?) ON CONFLICT(name) DO UPDATE SET status='running', "
                         "position=excluded.position, overrides=excluded.overrides, grid=excluded.grid, "
                         "started=excluded.started, finished=NULL, failure=NULL",
                         (name, position, json.dumps(overrides, sort_keys=True), json.dumps(grid), time.time()))

    def update_variant(self, name: str, **values: Any) -> None:
        cols = {k: (json.dumps(v) if k in ("units", "memory") else int(v) if isinstance(v, bool) else v)
                for k, v in values.items()}
        sets = ", ".join(f"{k} = ?" for k in cols)
        with self.connect() as conn, conn:
            conn.execute(f"UPDATE variants SET {sets} WHERE name = ?", (*cols.values(), name))  # noqa: S608

    def finish_variant(self, name: str, status: str, **values: Any) -> None:
        self.update_variant(name, status=status, finished=time.time(), **values)

    def record_run(self, row: RunRow, raw: bytes | None, log: str) -> None:
        """The raw file first (written whole, then renamed), then its row, in one transaction."""
        raw_file = None
        folder = self.folder / "raw" / row.variant
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"c{row.concurrency}-r{row.repeat}"
        if raw is not None:
            raw_file = f"raw/{row.variant}/{stem}.json"
            _atomic_write(self.folder / raw_file, raw)
        _atomic_write(folder / f"{stem}.log", log.encode())
        with self.connect() as conn, conn:
            conn.execute("INSERT OR REPLACE INTO runs (variant, concurrency, repeat, ok, failed_under_load, argv, "
                         "raw_file, figures, started, wall_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (row.variant, row.concurrency, row.repeat, int(row.ok), row.failed_under_load,
                          json.dumps(row.argv), raw_file, json.dumps(row.figures), row.started, row.wall_s))

    # ------------------------------------------------------------------------------------- reads

    def meta(self) -> dict[str, Any]:
        if not self.exists():
            return {}
        with self.connect() as conn:
            return {r["key"]: json.loads(r["value"]) for r in conn.execute("SELECT key, value FROM meta")}

    def variants(self) -> list[dict[str, Any]]:
        if not self.exists():
            return []
        with self.connect() as conn:
            rows = [dict(r) for r in conn.execute("SELECT * FROM variants ORDER BY position, name")]
        for r in rows:
            for k in ("overrides", "grid", "units", "memory"):
                r[k] = json.loads(r[k]) if r.get(k) else None
            r["synthetic"] = bool(r["synthetic"])
        return rows

    def variant(self, name: str) -> dict[str, Any] | None:
        return next((v for v in self.variants() if v["name"] == name), None)

    def runs(self, variant: str | None = None) -> list[RunRow]:
        if not self.exists():
            return []
        with self.connect() as conn:
            rows = list(conn.execute("SELECT * FROM runs WHERE ? IS NULL OR variant = ? "
                                     "ORDER BY variant, concurrency, repeat", (variant, variant)))
        return [RunRow(r["variant"], r["concurrency"], r["repeat"], bool(r["ok"]), r["failed_under_load"],
                       json.loads(r["argv"]), r["raw_file"], json.loads(r["figures"] or "{}"), r["started"],
                       r["wall_s"]) for r in rows]

    def finished(self) -> set[str]:
        return {v["name"] for v in self.variants() if v["status"] in FINISHED}


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
