"""全文引擎的 SQL（search/sql/）：每个文件都被迁移按 SHA-256 钉住、发布后不可再改；数据库里活的函数、触发器与表
和这些规范文件一致，漂移会被测出来。布局与版本规则见 search/fulltext.py 的说明。"""

from __future__ import annotations

import hashlib
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader

from search.migrations import _frozen_sql

SQL_DIR = _frozen_sql.SQL_DIR
MIGRATIONS_DIR = SQL_DIR.parent / "migrations"
FILE_NAME = re.compile(r"(?P<stem>[a-z0-9_]+)\.v(?P<version>[1-9][0-9]*)\.sql")
# 存储（表、类型）的文件是按编号叠加的变更；其余每个文件都是完整的 CREATE OR REPLACE 定义
STORAGE = "fulltext_storage"
DEFINES = re.compile(r"^CREATE OR REPLACE (FUNCTION|TRIGGER) (\w+)", re.MULTILINE)
# 退役的函数：最新一版文件只有 DROP
RETIRES = re.compile(r"^DROP (FUNCTION|TRIGGER) (\w+)", re.MULTILINE)
# 引擎的表（统计行 fulltext_kb_stats 是 Django 模型，列由 makemigrations --check 管）：与存储文件在空白 schema 里
# 建出来的逐项比较
STORAGE_RELATIONS = ["fulltext_blocks", "fulltext_deleted", "fulltext_deleted_terms", "fulltext_dictionary",
                     "fulltext_docs", "fulltext_l0", "fulltext_prefixes", "fulltext_segment_generation",
                     "fulltext_segments"]


def _versions() -> dict[str, list[Path]]:
    """文件名 stem → 各版本的文件（按编号升序）。"""
    found: dict[str, list[tuple[int, Path]]] = {}
    for path in SQL_DIR.glob("*.sql"):
        match = FILE_NAME.fullmatch(path.name)
        assert match, f"{path.name}: SQL files are named <name>.v<N>.sql"
        found.setdefault(match["stem"], []).append((int(match["version"]), path))
    return {stem: [path for _, path in sorted(paths)] for stem, paths in found.items()}


def _current_definitions() -> list[Path]:
    """函数与触发器的规范文件：每个名字编号最大的那一版。"""
    return [paths[-1] for stem, paths in sorted(_versions().items()) if stem != STORAGE]


def _execute(path: Path) -> None:
    """与迁移的 RunSQL 同样的方式执行一个文件（Django 按语句拆分、去掉语句外的注释）。"""
    with connection.cursor() as cursor:
        for statement in connection.ops.prepare_sql_script(_frozen_sql.read_sql(path.name)[0]):
            cursor.execute(statement)


def _live_functions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
                       " WHERE p.pronamespace = 'public'::regnamespace AND starts_with(p.proname, 'fulltext_')")
        return dict(cursor.fetchall())


def _live_triggers() -> dict[str, str]:
    """调用全文函数、或装在全文表上的触发器（Django 与别的应用的触发器不算）。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT t.tgname, pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text FROM pg_trigger t"
                       " JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_class c ON c.oid = t.tgrelid"
                       " WHERE NOT t.tgisinternal AND c.relnamespace = 'public'::regnamespace"
                       " AND (starts_with(p.proname, 'fulltext_') OR starts_with(c.relname, 'fulltext_'))")
        return dict(cursor.fetchall())


def _storage_shape(schema: str) -> dict[str, Any]:
    """一个 schema 里引擎的表与行类型：列（名、类型、排序规则、非空）、主键、索引与存储参数。"""
    shape: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.relkind, c.reloptions,"
            " (SELECT array_agg(ARRAY[a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull::text,"
            "  coalesce(co.collname, '')] ORDER BY a.attnum) FROM pg_attribute a"
            "  LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 'default'::regcollation"
            "  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),"
            " (SELECT array_agg(pg_get_constraintdef(k.oid) ORDER BY k.conname) FROM pg_constraint k"
            "  WHERE k.conrelid = c.oid AND k.contype = 'p'),"
            " (SELECT array_agg(i.relname || ': ' || replace(pg_get_indexdef(x.indexrelid), %s, '') ORDER BY i.relname)"
            "  FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = c.oid)"
            " FROM pg_class c WHERE c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)",
            [f"{schema}.", schema, STORAGE_RELATIONS],
        )
        for name, *rest in cursor.fetchall():
            shape[name] = rest
    return shape


def test_every_sql_file_is_pinned_by_a_migration_and_unchanged() -> None:
    """发布过的 SQL 文件不可再改：迁移记着每个文件的 SHA-256（加载时就核对），每个文件都至少被一个迁移钉住。

    改了文件、这里失败时：把文件改回去，新版本写成新文件（``<名字>.v{N+1}.sql``）并由一个新迁移应用。
    """
    MigrationLoader(None, ignore_no_migrations=True)  # 导入全部迁移：frozen_sql 在导入时核对并登记
    files = {path.name: _frozen_sql.read_sql(path.name)[1] for path in SQL_DIR.glob("*.sql")}
    assert files, "search/sql/ is empty"
    assert set(_frozen_sql.PINNED) == set(files), "every SQL file must be applied (pinned) by a migration"
    assert files == _frozen_sql.PINNED


def test_frozen_sql_refuses_a_changed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.v1.sql").write_text("SELECT 1;\n", encoding="utf-8")
    monkeypatch.setattr(_frozen_sql, "SQL_DIR", tmp_path)
    monkeypatch.setattr(_frozen_sql, "PINNED", {})
    digest = hashlib.sha256(b"SELECT 1;\n").hexdigest()
    assert _frozen_sql.frozen_sql("x.v1.sql", digest) == "SELECT 1;\n"
    (tmp_path / "x.v1.sql").write_bytes(b"SELECT 1;\r\n")  # 检出成 CRLF 不算改动
    assert _frozen_sql.frozen_sql("x.v1.sql", digest) == "SELECT 1;\n"
    (tmp_path / "x.v1.sql").write_text("SELECT 2;\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match=r"x\.v1\.sql has changed"):
        _frozen_sql.frozen_sql("x.v1.sql", digest)


def test_migrations_neither_import_each_other_nor_patch_sql() -> None:
    """迁移里的 SQL 只来自冻结的文件或迁移自己：不导入别的迁移（importlib）再对它的字符串做替换。"""
    for path in sorted(MIGRATIONS_DIR.glob("[0-9]*.py")):
        source = path.read_text(encoding="utf-8")
        assert "importlib" not in source and "import_module" not in source, path.name
        assert ".replace(" not in source, path.name
        importlib.import_module(f"search.migrations.{path.stem}")


@pytest.mark.django_db
def test_live_functions_and_triggers_are_the_canonical_files() -> None:
    """数据库里的全文函数与触发器正好是规范文件定义的那些，而且与文件一字不差：把文件原样再执行一遍
    （都是 CREATE OR REPLACE），目录里的定义什么也不变。"""
    files, retired = [], set()
    declared: dict[str, set[str]] = {kind: set() for kind in ("FUNCTION", "TRIGGER")}
    for path in _current_definitions():
        text = _frozen_sql.read_sql(path.name)[0]
        defines = DEFINES.findall(text)
        for kind, name in defines:
            declared[kind].add(name)
        if defines:
            files.append(path)
        else:
            retired |= {name for _, name in RETIRES.findall(text)}
    assert retired, "fulltext_stats_apply and fulltext_impact were retired by their v2 files"
    functions, triggers = _live_functions(), _live_triggers()
    assert set(functions) == declared["FUNCTION"]
    assert set(triggers) == declared["TRIGGER"]
    assert not retired & set(functions)
    with transaction.atomic():
        for path in files:
            _execute(path)
        assert _live_functions() == functions
        assert _live_triggers() == triggers
        transaction.set_rollback(True)


@pytest.mark.django_db
def test_live_tables_are_the_canonical_storage() -> None:
    """引擎的表与行类型和存储文件一致：在一个空白 schema 里按编号执行存储文件，与 public 里的逐项比较。"""
    live = _storage_shape("public")
    assert sorted(live) == STORAGE_RELATIONS
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA fulltext_engine_check")
        cursor.execute("SET LOCAL search_path TO fulltext_engine_check")
        # v1 的存储文件要改 Django 模型建的词统计表 fulltext_term_stats（v2 的迁移已把它删掉）：照当年的模型建一张
        cursor.execute("CREATE TABLE fulltext_term_stats (knowledge_base_id uuid NOT NULL,"
                       " lexeme text COLLATE \"C\" NOT NULL, df bigint NOT NULL,"
                       " CONSTRAINT fulltext_term_stats_pkey PRIMARY KEY (knowledge_base_id, lexeme))")
        for path in _versions()[STORAGE]:
            _execute(path)
        assert _storage_shape("fulltext_engine_check") == live
        transaction.set_rollback(True)
