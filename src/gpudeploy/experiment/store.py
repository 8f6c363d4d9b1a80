"""The results store: one SQLite file (stdlib ``sqlite3``) and the client's raw files, in the results folder.

    <results>/experiment.sqlite        variants (one row each) and runs (variant x concurrency x repeat)
    <results>/raw/<variant>-<key>/c<C>-r<R>.json   the client's own result file, byte for byte
    <results>/raw/<variant>-<key>/c<C>-r<R>.log    what the client printed

A variant is known by its key (spec.variant_key: a digest of its overrides and the benchmark settings),
not by its name: a variant edited since its runs were made is another variant (its old runs are not
reused), and a grid point keeps its runs when the names shift (``grid-N`` after a variant is added).
Its name is a label, updated to the one the experiment file gives it now.

Every change is one transaction, so a Ctrl-C (or a crash) leaves either the run recorded with its raw
file or not recorded at all; a variant is ``running`` until its outcome is written, which ``--resume``
reads as "not finished". Reading never writes (``experiment.show`` of a committed store changes
nothing); a store of the first layout (variants keyed by name, PRAGMA user_version 0) is read as it
is, its keys computed from its rows and its meta's benchmark, and moved to this layout by the first
write.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import variant_key

VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS variants (
    key TEXT PRIMARY KEY,            -- spec.variant_key: overrides + benchmark settings
    name TEXT NOT NULL,              -- as the experiment file names it (last time it ran or was seen)
    position INTEGER NOT NULL,
    status TEXT NOT NULL,            -- running | measured | skipped | deploy-failed | bench-failed |
                                     -- failed-under-load | interrupted
    overrides TEXT NOT NULL,         -- JSON: role -> overrides
    grid TEXT NOT NULL,              -- JSON: [[dimension, value], ...]
    verdict TEXT,                    -- the memory preflight's, for a skipped variant; else its warnings
    saved_s REAL,                    -- a skipped variant: the deploy it did not have to try
    failure TEXT,                    -- deploy-failed / bench-failed / failed-under-load: what happened
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
    variant_key TEXT NOT NULL REFERENCES variants(key),
    variant TEXT NOT NULL,           -- its name when the run was made
    concurrency INTEGER NOT NULL,
    repeat INTEGER NOT NULL,
    ok INTEGER NOT NULL,             -- the client finished and wrote its result
    failed_under_load TEXT,          -- an engine died during this run: its cause
    argv TEXT NOT NULL,              -- JSON: the client's argv as run
    raw_file TEXT,                   -- relative to the results folder
    figures TEXT,                    -- JSON: bench.figures() of the raw file
    started REAL NOT NULL,
    wall_s REAL NOT NULL,
    PRIMARY KEY (variant_key, concurrency, repeat)
);
"""
V1_COLUMNS = ("position, status, overrides, grid, verdict, saved_s, failure, units, engine, engine_release, memory, "
              "client, synthetic, gpus, deploy_s, started, finished")
RUN_COLUMNS = "concurrency, repeat, ok, failed_under_load, argv, raw_file, figures, started, wall_s"

# What --resume does not run again. A failed deploy or benchmark is run again: its cause may have been
# the host (a timeout on a loaded machine, a host that did not answer, an SSH connection that broke).
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
    key: str = ""  # the variant's key; "" = its name is its key (a store written before keys)

    @property
    def variant_key(self) -> str:
        return self.key or self.variant


class Store:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "experiment.sqlite"

    def exists(self) -> bool:
        return self.path.is_file()

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """For writing: the folder and the tables made, a store of the first layout moved to this one."""
        self.folder.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            if _layout(conn) == 1:
                _migrate(conn)
            conn.executescript(SCHEMA)
            conn.execute(f"PRAGMA user_version = {VERSION}")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    # ------------------------------------------------------------------------------------ writes

    def set_meta(self, **values: Any) -> None:
        with self.connect() as conn, conn:
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             [(k, json.dumps(v)) for k, v in values.items()])

    def begin_variant(self, name: str, position: int, overrides: dict[str, Any], grid: list[Any],
                      key: str | None = None) -> None:
        """Mark the variant ``key`` running under ``name`` (keeping the runs it already has: a resumed
        variant reuses them)."""
        with self.connect() as conn, conn:
            conn.execute("INSERT INTO variants (key, name, position, status, overrides, grid, started) "
                         "VALUES (?, ?, ?, 'running', ?, ?, ?) ON CONFLICT(key) DO UPDATE SET status='running', "
                         "name=excluded.name, position=excluded.position, overrides=excluded.overrides, "
                         "grid=excluded.grid, started=excluded.started, finished=NULL, failure=NULL",
                         (key or name, name, position, json.dumps(overrides, sort_keys=True), json.dumps(grid),
                          time.time()))

    def relabel(self, key: str, name: str, position: int) -> None:
        """A finished variant that the experiment file now names ``name`` at ``position``."""
        with self.connect() as conn, conn:
            conn.execute("UPDATE variants SET name = ?, position = ? WHERE key = ?", (name, position, key))

    def update_variant(self, key: str, **values: Any) -> None:
        cols = {k: (json.dumps(v) if k in ("units", "memory") else int(v) if isinstance(v, bool) else v)
                for k, v in values.items()}
        sets = ", ".join(f"{k} = ?" for k in cols)
        with self.connect() as conn, conn:
            conn.execute(f"UPDATE variants SET {sets} WHERE key = ?", (*cols.values(), key))  # noqa: S608

    def finish_variant(self, key: str, status: str, **values: Any) -> None:
        self.update_variant(key, status=status, finished=time.time(), **values)

    def record_run(self, row: RunRow, raw: bytes | None, log: str) -> None:
        """The raw file first (written whole, then renamed), then its row, in one transaction."""
        raw_file = None
        sub = row.variant if not row.key else f"{row.variant}-{row.key}"
        folder = self.folder / "raw" / sub
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"c{row.concurrency}-r{row.repeat}"
        if raw is not None:
            raw_file = f"raw/{sub}/{stem}.json"
            _atomic_write(self.folder / raw_file, raw)
        _atomic_write(folder / f"{stem}.log", log.encode())
        with self.connect() as conn, conn:
            conn.execute("INSERT OR REPLACE INTO runs (variant_key, variant, concurrency, repeat, ok, "
                         "failed_under_load, argv, raw_file, figures, started, wall_s) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (row.variant_key, row.variant, row.concurrency, row.repeat, int(row.ok),
                          row.failed_under_load, json.dumps(row.argv), raw_file, json.dumps(row.figures),
                          row.started, row.wall_s))

    # ------------------------------------------------------------------------------------- reads

    def meta(self) -> dict[str, Any]:
        if not self.exists():
            return {}
        with self._read() as conn:
            return _meta(conn)

    def variants(self) -> list[dict[str, Any]]:
        """Every stored variant (also those the experiment file no longer defines: see ``current``)."""
        if not self.exists():
            return []
        with self._read() as conn:
            if _layout(conn) == 1:
                rows = _v1_variants(conn)
            else:
                rows = [dict(r) for r in conn.execute("SELECT * FROM variants ORDER BY position, name")]
        for r in rows:
            for k in ("overrides", "grid", "units", "memory"):
                r[k] = json.loads(r[k]) if r.get(k) else None
            r["synthetic"] = bool(r["synthetic"])
        return rows

    def current(self) -> list[dict[str, Any]]:
        """The variants of the experiment as it last ran (meta ``variant_keys``; all in an older store)."""
        keys = self.meta().get("variant_keys")
        rows = self.variants()
        return rows if keys is None else [r for r in rows if r["key"] in set(keys)]

    def variant(self, key: str) -> dict[str, Any] | None:
        return next((v for v in self.variants() if v["key"] == key), None)

    def runs(self, key: str | None = None) -> list[RunRow]:
        """The runs of the variant ``key`` (every run without it)."""
        if not self.exists():
            return []
        with self._read() as conn:
            if _layout(conn) == 1:
                keys = {r["name"]: r["key"] for r in _v1_variants(conn)}
                rows = [{**dict(r), "variant_key": keys.get(r["variant"], r["variant"])}
                        for r in conn.execute("SELECT * FROM runs ORDER BY variant, concurrency, repeat")]
            else:
                rows = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY variant, concurrency, repeat")]
        return [RunRow(r["variant"], r["concurrency"], r["repeat"], bool(r["ok"]), r["failed_under_load"],
                       json.loads(r["argv"]), r["raw_file"], json.loads(r["figures"] or "{}"), r["started"],
                       r["wall_s"], r["variant_key"]) for r in rows if key is None or r["variant_key"] == key]

    def finished(self) -> set[str]:
        """The keys of the variants --resume does not run again."""
        return {v["key"] for v in self.variants() if v["status"] in FINISHED}


def _layout(conn: sqlite3.Connection) -> int:
    """1: the first layout (variants keyed by name); 2: this one (also for a new, empty file)."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(variants)")]
    return 1 if cols and "key" not in cols else VERSION


def _meta(conn: sqlite3.Connection) -> dict[str, Any]:
    return {r["key"]: json.loads(r["value"]) for r in conn.execute("SELECT key, value FROM meta")}


def _v1_variants(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The first layout's rows with their keys: its overrides and the benchmark its meta names."""
    bench = _meta(conn).get("benchmark")
    rows = [dict(r) for r in conn.execute("SELECT * FROM variants ORDER BY position, name")]
    for r in rows:
        r["key"] = variant_key(json.loads(r["overrides"]), bench) if isinstance(bench, dict) else r["name"]
    return rows


def _migrate(conn: sqlite3.Connection) -> None:
    """The first layout -> this one, in one transaction (its raw files stay where they are)."""
    rows = _v1_variants(conn)
    conn.execute("BEGIN IMMEDIATE")  # sqlite3 opens no transaction before DDL by itself
    try:
        conn.execute("ALTER TABLE variants RENAME TO variants_v1")
        conn.execute("ALTER TABLE runs RENAME TO runs_v1")
        for statement in re.sub(r"--[^\n]*", "", SCHEMA).split(";"):  # executescript would commit first
            if statement.strip():
                conn.execute(statement)
        for r in rows:
            conn.execute(f"INSERT OR IGNORE INTO variants (key, name, {V1_COLUMNS}) SELECT ?, name, {V1_COLUMNS} "  # noqa: S608
                         "FROM variants_v1 WHERE name = ?", (r["key"], r["name"]))
            conn.execute(f"INSERT OR IGNORE INTO runs (variant_key, variant, {RUN_COLUMNS}) SELECT ?, variant, "  # noqa: S608
                         f"{RUN_COLUMNS} FROM runs_v1 WHERE variant = ?", (r["key"], r["name"]))
        conn.execute("DROP TABLE runs_v1")
        conn.execute("DROP TABLE variants_v1")
        conn.execute(f"PRAGMA user_version = {VERSION}")
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
