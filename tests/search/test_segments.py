"""全文引擎 v2 的写侧（search.segments）：L0 与段的检索结果一致、合并策略、删除的清除、定时任务与命令、升级回填。"""

from __future__ import annotations

import importlib
import io
import itertools
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from documents.filters import SearchFilters
from documents.models import Document, DocumentChunk
from documents.services import document_delete, document_upload
from infra.principal import SYSTEM_PRINCIPAL
from knowledge.models import KnowledgeBase
from ops.tasks import compact_fulltext, maintain_fulltext
from raglib import analysis, forward
from raglib.bm25 import allot_postings, score_terms
from raglib.lexicon import DictionaryBlock, Entry, encode_dictionary, unpack_dictionary_block
from raglib.postings import decode_blocks, dense_norms
from search import bm25, segment_cache, segments
from search.chunk_terms import reanalysed
from search.retrieval import fulltext_search
from search.segment_cache import DICTIONARIES, SegmentDictionaries
from tests.sample_docs import MEDICAL_TEXTS
from tests.search.oracle import engine_terms

TEXTS = MEDICAL_TEXTS
PLAIN_QUERIES = ["高血压能吃党参吗", "乙肝 肝功能 复查", "hypertension blood pressure", "肝", "饮食 控制"]
# 布尔与短语查询：回表时按引擎的正排 / 对原文重新切词检查，L0 与段里的分块都要走到
QUERIES = [*PLAIN_QUERIES, "乙肝 -复查", "\"高血压\" 饮食"]
BACKFILL_0010 = importlib.import_module("search.migrations.0010_fulltext_document_ids").BACKFILL_SQL
# 存储 v4 给已有的行加列时占位的值
ZERO = "00000000-0000-0000-0000-000000000000"


def _upload(kb: KnowledgeBase, name: str, text: str, capture: Any) -> Document:
    with capture(execute=True):
        return document_upload(kb=kb, filename=name, upload=io.BytesIO(text.encode()), metadata={}, chunking={})


def _results(kb: KnowledgeBase, queries: list[str] = QUERIES) -> list[list[tuple[int, float]]]:
    return [[(hit.chunk_id, round(hit.value, 9)) for hit in fulltext_search(
        kb, analysis.parse_query(query, analyzer="bigram"), SearchFilters(), limit=20).hits] for query in queries]


def _compacted_kb(kb: KnowledgeBase, count: int, *, every: int, spread: int) -> tuple[KnowledgeBase, Document]:
    """一个合并完的库：``count`` 个分块都含“复查”，每 ``every`` 个里有一个含“病人”，词数 2 + i % ``spread``。"""
    document = Document.objects.create(knowledge_base=kb, filename="x.txt", status=Document.Status.COMPLETED,
                                       chunk_count=count)
    DocumentChunk.objects.bulk_create(
        DocumentChunk(knowledge_base=kb, document=document, chunk_index=i, chunk_text=f"复查 {i}",
                      search_vector="'复查':1" + (" '病人':2" if i % every == 0 else ""), search_length=2 + i % spread)
        for i in range(count))
    segments.compact(kb.id)
    return kb, document


def _restore_search_vectors(cursor: Any, kb: KnowledgeBase) -> None:
    """把分块的 tsvector 写回分块行（search.0016 之前的样子，按原文重新切词），绕过触发器：测旧迁移的回填用。"""
    cursor.execute("SELECT id FROM document_chunks WHERE knowledge_base_id = %s", [kb.id])
    vectors = reanalysed(cursor, [int(row[0]) for row in cursor.fetchall()])
    cursor.execute("SET LOCAL session_replication_role = replica")
    cursor.execute("UPDATE document_chunks c SET search_vector = v.sv FROM unnest(%s::bigint[], %s::text[]) v(id, sv)"
                   " WHERE c.id = v.id", [list(vectors), list(vectors.values())])
    cursor.execute("SET LOCAL session_replication_role = DEFAULT")


def _count(table: str, kb: KnowledgeBase) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE knowledge_base_id = %s", [kb.id])
        return int(cursor.fetchone()[0])


@pytest.fixture
def in_l0(kb_factory: Any, fake_embedder: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> KnowledgeBase:
    """全部分块还在 L0 里的知识库（合并门槛调高）。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 10_000
    kb = kb_factory()
    for i, text in enumerate(TEXTS):
        _upload(kb, f"doc{i}.txt", text, django_capture_on_commit_callbacks)
    return kb


@pytest.mark.django_db
def test_l0_segments_and_a_mix_of_both_rank_identically(in_l0: KnowledgeBase,
                                                        django_capture_on_commit_callbacks: Any) -> None:
    """同一组分块，全在 L0、全在段里、一半一半（外加删掉又写回的），检索结果与分数逐一相同。"""
    assert _count("fulltext_l0", in_l0) == len(TEXTS) and _count("fulltext_segments", in_l0) == 0
    from_l0 = _results(in_l0)
    segments.compact(in_l0.id, batch=3)  # 三个一段：几个段
    assert _count("fulltext_l0", in_l0) == 0 and _count("fulltext_segments", in_l0) >= 2
    assert _results(in_l0) == from_l0
    # 删掉一个已进段的文档再原样写回：段里留着它的旧倒排（删除集过滤），新分块在 L0
    document = Document.objects.filter(knowledge_base=in_l0).order_by("created_at").first()
    assert document is not None
    with django_capture_on_commit_callbacks(execute=True):
        document_delete(principal=SYSTEM_PRINCIPAL, document_id=document.id)
    _upload(in_l0, "again.txt", TEXTS[0], django_capture_on_commit_callbacks)
    assert _count("fulltext_deleted", in_l0) == 1 and _count("fulltext_l0", in_l0) == 1
    mixed = _results(in_l0)
    assert segments.mismatches(in_l0.id) == []
    segments.compact(in_l0.id)
    assert _results(in_l0) == mixed
    assert segments.mismatches(in_l0.id) == []


@pytest.mark.django_db
def test_adjacent_segments_of_one_tier_merge(in_l0: KnowledgeBase, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "MERGE_FACTOR", 3)
    result = segments.compact(in_l0.id, batch=1)  # 8 个分块，一个一段：每满 3 个同层段就并
    assert result.chunks == len(TEXTS) and result.merged >= 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT first_ordinal, end_ordinal, doc_count FROM fulltext_segments"
                       " WHERE knowledge_base_id = %s ORDER BY first_ordinal", [in_l0.id])
        ranges = cursor.fetchall()
    assert len(ranges) < 3  # 同层的段不会攒到 MERGE_FACTOR 个
    # 段的序号范围首尾相接，覆盖全部分块
    assert ranges[0][0] == 0 and ranges[-1][1] == len(TEXTS)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert segments.mismatches(in_l0.id) == []


@pytest.mark.django_db
def test_a_segment_with_many_deletions_is_rewritten(in_l0: KnowledgeBase,
                                                    django_capture_on_commit_callbacks: Any) -> None:
    segments.compact(in_l0.id)
    for document in Document.objects.filter(knowledge_base=in_l0).order_by("created_at")[:3]:
        with django_capture_on_commit_callbacks(execute=True):
            document_delete(principal=SYSTEM_PRINCIPAL, document_id=document.id)
    assert _count("fulltext_deleted", in_l0) == 3
    result = segments.compact(in_l0.id)
    assert result.purged == 3  # 三成被删，超过十分之一：段重写，删除集清空
    assert _count("fulltext_deleted", in_l0) == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT chunk_count FROM fulltext_kb_stats WHERE knowledge_base_id = %s", [in_l0.id])
        assert cursor.fetchone()[0] == len(TEXTS) - 3
    assert segments.mismatches(in_l0.id) == []


@pytest.mark.django_db
def test_the_task_compacts_when_due_and_the_schedule_compacts_everything(in_l0: KnowledgeBase,
                                                                         settings: Any) -> None:
    settings.FULLTEXT_L0_MAX_CHUNKS = len(TEXTS) + 1
    compact_fulltext(str(in_l0.id), due_only=True)  # 写入后入队的：L0 还没攒够，不合并
    assert _count("fulltext_l0", in_l0) == len(TEXTS)
    compact_fulltext()  # 每分钟的定时任务：有 L0 的知识库都合并
    assert _count("fulltext_l0", in_l0) == 0 and _count("fulltext_docs", in_l0) == len(TEXTS)


@pytest.mark.django_db
def test_ingestion_queues_a_compaction_once_enough_chunks_were_written(
        kb_factory: Any, fake_embedder: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    settings.FULLTEXT_L0_MAX_CHUNKS = 3
    kb = kb_factory()
    for i, text in enumerate(TEXTS[:2]):
        _upload(kb, f"doc{i}.txt", text, django_capture_on_commit_callbacks)
    assert _count("fulltext_l0", kb) == 2  # 本进程写了 2 个分块，还没到门槛
    _upload(kb, "doc2.txt", TEXTS[2], django_capture_on_commit_callbacks)
    assert _count("fulltext_l0", kb) == 0 and _count("fulltext_docs", kb) == 3


@pytest.mark.django_db
def test_compact_command_reports_progress_batch_by_batch(in_l0: KnowledgeBase, settings: Any) -> None:
    settings.FULLTEXT_COMPACT_BATCH = 3
    out = io.StringIO()
    call_command("compact_fulltext", "--kb", in_l0.name, stdout=out)
    lines = out.getvalue().splitlines()
    assert f"{len(TEXTS)} 个分块待合并" in lines[0]
    assert [line.split("/")[0].strip() for line in lines[1:4]] == ["3", "6", "8"]
    assert "完成：8 个分块" in lines[-1]
    out = io.StringIO()
    call_command("compact_fulltext", stdout=out)  # 再运行：没有剩下的
    assert out.getvalue().strip() == "没有待合并的分块"


@pytest.mark.django_db
def test_upgrade_backfills_put_existing_chunks_into_l0_and_record_their_documents(in_l0: KnowledgeBase) -> None:
    """迁移的回填：search.0008 把 v1 时代的库（有统计行与分块，没有 L0 与段）放进 L0，立即可查、统计精确；
    search.0010 给 L0 与序号表里已有的行补上分块所属的文档（加列时先占位的零值）。"""
    segments.compact(in_l0.id)
    expected = _results(in_l0)
    with connection.cursor() as cursor:
        for table in ("fulltext_l0", "fulltext_docs", "fulltext_deleted", "fulltext_blocks", "fulltext_dictionary",
                      "fulltext_prefixes", "fulltext_segments"):
            cursor.execute(f"DELETE FROM {table} WHERE knowledge_base_id = %s", [in_l0.id])
        # 0008 时 L0 还没有 document_id 这一列：暂时去掉它的非空约束代替；分块的词位那时存在分块行里、还是 tsvector
        # 列（documents.0013 才改存文本，search.0016 起不再存）：绕过触发器写回去、暂时改回那时的类型
        # （都在测试的事务里，结束时回滚；改表前先让延迟的外键检查跑完）
        cursor.execute("ALTER TABLE fulltext_l0 ALTER COLUMN document_id DROP NOT NULL")
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        _restore_search_vectors(cursor, in_l0)
        # 改列的类型前先去掉 WHEN 条件里用到这一列的触发器（之后不再写分块，随事务回滚回来）
        cursor.execute("DROP TRIGGER document_chunks_fulltext_update ON document_chunks")
        cursor.execute("ALTER TABLE document_chunks ALTER COLUMN search_vector TYPE tsvector"
                       " USING search_vector::tsvector")
        cursor.execute(importlib.import_module("search.migrations.0008_fulltext_segments").BACKFILL_SQL)
        cursor.execute("ALTER TABLE document_chunks ALTER COLUMN search_vector TYPE text USING search_vector::text")
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("UPDATE document_chunks SET search_vector = NULL WHERE knowledge_base_id = %s", [in_l0.id])
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute(BACKFILL_0010)
        cursor.execute("ALTER TABLE fulltext_l0 ALTER COLUMN document_id SET NOT NULL")
    assert _count("fulltext_l0", in_l0) == DocumentChunk.objects.filter(knowledge_base=in_l0).count()
    assert segments.mismatches(in_l0.id) == []
    assert _results(in_l0) == expected

    segments.compact(in_l0.id, batch=3, once=True)  # 一部分合并进段，一部分留在 L0
    with connection.cursor() as cursor:
        for table in ("fulltext_l0", "fulltext_docs"):
            cursor.execute(f"UPDATE {table} SET document_id = %s WHERE knowledge_base_id = %s", [ZERO, in_l0.id])
    assert segments.mismatches(in_l0.id)  # 核对看得出记错的文档
    assert not any(_results(in_l0, PLAIN_QUERIES))  # 没有过滤条件的普通查询按记着的文档检查范围
    with connection.cursor() as cursor:
        cursor.execute(BACKFILL_0010)
    assert segments.mismatches(in_l0.id) == []
    assert _results(in_l0) == expected


@pytest.mark.django_db
def test_forward_index_backfill_of_0016(in_l0: KnowledgeBase, django_capture_on_commit_callbacks: Any) -> None:
    """迁移 search.0016 的回填：已合并的分块从（那时还在的）tsvector 列得到正排，删除集的行从它的词位数组得到；
    回填出的正排与合并时写的相同（删除集只比词位：那时它只存了词位）。"""
    segments.compact(in_l0.id, batch=3)
    document = Document.objects.filter(knowledge_base=in_l0).order_by("created_at").first()
    assert document is not None
    with django_capture_on_commit_callbacks(execute=True):
        document_delete(principal=SYSTEM_PRINCIPAL, document_id=document.id)

    def deleted() -> dict[int, list[str]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT ordinal, terms FROM fulltext_deleted WHERE knowledge_base_id = %s", [in_l0.id])
            return {int(o): forward.decode(bytes(data)).lexemes for o, data in cursor.fetchall()}

    merged, removed = engine_terms(in_l0.id), deleted()
    assert merged and removed
    with connection.cursor() as cursor:
        # 回到 0016 之前的样子：正排还没有，删除集存词位数组，分块行里有 tsvector（都在测试的事务里，结束时回滚）
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE fulltext_docs ALTER COLUMN terms DROP NOT NULL")
        cursor.execute("ALTER TABLE fulltext_deleted ALTER COLUMN terms DROP NOT NULL")
        cursor.execute("ALTER TABLE fulltext_deleted ADD COLUMN lexemes text[]")
        for ordinal, lexemes in removed.items():
            cursor.execute("UPDATE fulltext_deleted SET lexemes = %s::text[], terms = NULL"
                           " WHERE knowledge_base_id = %s AND ordinal = %s", [lexemes, in_l0.id, ordinal])
        cursor.execute("UPDATE fulltext_docs SET terms = NULL WHERE knowledge_base_id = %s", [in_l0.id])
        _restore_search_vectors(cursor, in_l0)
    with connection.schema_editor() as editor:
        importlib.import_module("search.migrations.0016_fulltext_forward_index").backfill(None, editor)
    assert engine_terms(in_l0.id) == merged
    assert deleted() == removed


@pytest.mark.django_db
def test_prefix_dfs_are_written_with_each_segment_and_backfilled_by_0009(in_l0: KnowledgeBase) -> None:
    """每个段按首字汇总的 df 随段写出、随并段换掉；迁移 search.0009 给已有的段回填出同样的行。"""
    segments.compact(in_l0.id, batch=3)
    segments.merge_all(in_l0.id)
    segments.compact(in_l0.id, batch=2)  # 再写几段（没有可合并的，段照旧）

    def rows() -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT segment_id, prefix, df FROM fulltext_prefixes WHERE knowledge_base_id = %s"
                           " ORDER BY 1, 2", [in_l0.id])
            return cursor.fetchall()

    written = rows()
    assert written and {row[1] for row in written} >= {"肝", "高"}
    assert segments.mismatches(in_l0.id) == []
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM fulltext_prefixes WHERE knowledge_base_id = %s", [in_l0.id])
        # 0009 运行时的段是未压缩的词典块（压缩是后来的格式，见 raglib.lexicon）：先把块还原成那时的样子
        cursor.execute("SELECT segment_id, first_lexeme, data FROM fulltext_dictionary WHERE knowledge_base_id = %s",
                       [in_l0.id])
        for segment_id, first, data in cursor.fetchall():
            cursor.execute("UPDATE fulltext_dictionary SET data = %s WHERE knowledge_base_id = %s"
                           " AND segment_id = %s AND first_lexeme = %s",
                           [unpack_dictionary_block(bytes(data)), in_l0.id, segment_id, first])
    backfill = importlib.import_module("search.migrations.0009_fulltext_prefixes").backfill
    backfill(None, SimpleNamespace(connection=connection))
    assert rows() == written


@pytest.mark.django_db
def test_a_prefix_term_reads_dictionary_blocks_only_when_its_postings_are_read(
        in_l0: KnowledgeBase, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """孤立的单字（前缀词）的 df 来自按首字的汇总；只有额度里要读它的倒排时才去取以它开头的词典块。"""
    segments.compact(in_l0.id)
    asked: list[tuple[str, bool]] = []
    real = DICTIONARIES.entries

    def recording(cursor: Any, kb_id: Any, found: Any, keys: Any) -> Any:
        asked.extend(keys)
        return real(cursor, kb_id, found, keys)

    monkeypatch.setattr(DICTIONARIES, "entries", recording)
    query = analysis.parse_query("乙肝病毒 肝", analyzer="bigram")
    assert ("肝", True) in {(t.lexeme, t.prefix) for t in query.terms}
    read: dict[int, bool] = {}
    for budget in (100_000, 3):
        settings.BM25_MAX_POSTINGS = budget
        asked.clear()
        hits = fulltext_search(in_l0, query, SearchFilters(), limit=20).hits
        statistics = bm25.load_statistics(in_l0.id, query.terms)
        reads = allot_postings(score_terms(query.terms, statistics.dfs, statistics.n, bm25._bm25_params()), budget)
        read[budget] = any(one.scored.term.prefix for one in reads)
        assert (("肝", True) in asked) == read[budget], (budget, asked)
        assert hits
    # 额度充足时读它的倒排（取了词典块）；额度 3 时读不起：前缀词跳过，也没有为它取词典块
    assert read == {100_000: True, 3: False}


@pytest.mark.django_db
def test_prefix_dfs_are_cached_per_segment_and_equal_the_table(in_l0: KnowledgeBase,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """前缀词按首字汇总的 df 按 (段的代号, 前缀) 缓存：与表里逐段相加相同（段里没有的不列），再查不进数据库。"""
    monkeypatch.setattr(segments, "MERGE_FACTOR", 100)
    segments.compact(in_l0.id, batch=3)  # 几个段
    with connection.cursor() as cursor:
        cursor.execute("SELECT segment_id, generation FROM fulltext_segments WHERE knowledge_base_id = %s"
                       " ORDER BY segment_id", [in_l0.id])
        found = [(int(segment_id), int(generation)) for segment_id, generation in cursor.fetchall()]
        cursor.execute("SELECT prefix, sum(df) FROM fulltext_prefixes WHERE knowledge_base_id = %s"
                       " AND prefix = ANY(%s) GROUP BY prefix", [in_l0.id, ["肝", "高", "无"]])
        expected = {prefix: int(df) for prefix, df in cursor.fetchall()}
    assert len(found) > 1 and expected["肝"] > 0 and "无" not in expected
    DICTIONARIES.clear()
    statements: list[str] = []

    def recording(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(recording), connection.cursor() as cursor:
        assert DICTIONARIES.prefix_dfs(cursor, in_l0.id, found, ["肝", "高", "无"]) == expected
        assert len(statements) == 1
        assert DICTIONARIES.prefix_dfs(cursor, in_l0.id, found, ["高", "无", "肝"]) == expected
        assert len(statements) == 1
        # 一个段的：与表里这个段的行相同（缓存里已有，仍不进数据库）
        cursor.execute("SELECT prefix, df FROM fulltext_prefixes WHERE knowledge_base_id = %s AND segment_id = %s"
                       " AND prefix = '肝'", [in_l0.id, found[0][0]])
        first = {prefix: int(df) for prefix, df in cursor.fetchall()}
        statements.clear()
        assert DICTIONARIES.prefix_dfs(cursor, in_l0.id, found[:1], ["肝"]) == first
        assert statements == []


@pytest.mark.django_db
def test_prefix_entries_are_cached_per_segment_and_match_the_dictionary(in_l0: KnowledgeBase,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """要读倒排的前缀词：各段的条目整理一次（内联的倒排按词位首尾相接，块表里的留成条目）按 (代号, 前缀) 缓存，
    与从词典块里逐个找出来的相同；再查不必再找。"""
    monkeypatch.setattr(segments, "MERGE_FACTOR", 100)
    segments.compact(in_l0.id, batch=3)
    with connection.cursor() as cursor:
        cursor.execute("SELECT segment_id, generation FROM fulltext_segments WHERE knowledge_base_id = %s"
                       " ORDER BY segment_id", [in_l0.id])
        found = [(int(segment_id), int(generation)) for segment_id, generation in cursor.fetchall()]
        DICTIONARIES.clear()
        plain = DICTIONARIES.entries(cursor, in_l0.id, found, [("肝", True), ("无", True)])
        asked: list[Any] = []
        real = DICTIONARIES.entries

        def recording(*args: Any) -> Any:
            asked.append(args[3])
            return real(*args)

        monkeypatch.setattr(DICTIONARIES, "entries", recording)
        for _ in range(2):
            got = DICTIONARIES.prefix_entries(cursor, in_l0.id, found, ["肝", "无"])
            for prefix in ("肝", "无"):
                assert [segment_id for segment_id, _ in got[prefix]] == [segment_id for segment_id, _ in found]
                for segment_id, entries in got[prefix]:
                    expected = [entry for sid, entry in plain[(prefix, True)] if sid == segment_id]
                    inline = [entry.inline for entry in expected if entry.inline is not None]
                    assert entries.joined == b"".join(inline)
                    assert entries.lengths.tolist() == [len(data) for data in inline]
                    assert entries.blocked == tuple(entry for entry in expected if entry.inline is None)
        assert asked == [[("无", True), ("肝", True)]]  # 只有头一次去词典块里找
        assert sum(len(entries.lengths) for _, entries in got["肝"]) > 1 and not any(
            len(entries.lengths) for _, entries in got["无"])


@pytest.mark.django_db
def test_merge_all_folds_small_segments_into_one_with_identical_results(in_l0: KnowledgeBase,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        settings: Any) -> None:
    monkeypatch.setattr(segments, "MERGE_FACTOR", 100)  # 合并策略不自动并：一个分块一个段
    segments.compact(in_l0.id, batch=1)
    assert _count("fulltext_segments", in_l0) == len(TEXTS)
    expected = _results(in_l0)
    out = io.StringIO()
    call_command("compact_fulltext", "--kb", str(in_l0.id), "--merge", stdout=out)
    assert f"{len(TEXTS)} 个段并成 1 个" in out.getvalue()
    assert _count("fulltext_segments", in_l0) == 1
    assert _results(in_l0) == expected
    assert segments.mismatches(in_l0.id) == []
    settings.FULLTEXT_MAX_SEGMENT_CHUNKS = 3  # 上限之内分几段：8 个分块 → 不再并（已是一个 8 块的段）
    assert segments.merge_all(in_l0.id).segments == 0


def _with_norms_inside(data: bytes, norms: Any) -> bytes:
    """一个倒排块改回 v7 以前（2026-11-29）的写法：差值按字节，省掉的词频节照旧省，长度字节一节在块尾。"""
    p = decode_blocks([(0, data)], norms)
    deltas = np.diff(p.docs).tolist()
    width = next(w for w in (1, 2, 4) if max(deltas, default=0) < 256**w)
    head = width | (data[0] & 0x60)
    out = bytes([head]) + int(p.docs[0]).to_bytes(4, "little") + b"".join(d.to_bytes(width, "little") for d in deltas)
    out += (b"" if head & 0x40 else p.title_tf.tobytes()) + (b"" if head & 0x20 else p.body_tf.tobytes())
    return out + p.norms.tobytes()


def _rewrite_as_before_segment_norms(kb: KnowledgeBase, segment_ids: list[int]) -> None:
    """把这几个段改写成 v7 以前的样子：块与内联倒排自带长度字节，段表的 norms 为 NULL。"""
    with connection.cursor() as cursor:
        for segment_id in segment_ids:
            cursor.execute("SELECT first_ordinal, norms FROM fulltext_segments WHERE knowledge_base_id = %s"
                           " AND segment_id = %s", [kb.id, segment_id])
            first, data = cursor.fetchone()
            norms = dense_norms(first, np.frombuffer(bytes(data), dtype=np.uint8))
            cursor.execute("SELECT lexeme, block_no, data FROM fulltext_blocks WHERE knowledge_base_id = %s"
                           " AND segment_id = %s", [kb.id, segment_id])
            for lexeme, number, block in cursor.fetchall():
                cursor.execute("UPDATE fulltext_blocks SET data = %s WHERE knowledge_base_id = %s AND segment_id = %s"
                               " AND lexeme = %s AND block_no = %s",
                               [_with_norms_inside(bytes(block), norms), kb.id, segment_id, lexeme, number])
            cursor.execute("DELETE FROM fulltext_dictionary WHERE knowledge_base_id = %s AND segment_id = %s"
                           " RETURNING data", [kb.id, segment_id])
            entries = sorted((Entry(e.lexeme, e.df, None if e.inline is None else _with_norms_inside(e.inline, norms))
                              for (data,) in cursor.fetchall() for e in DictionaryBlock(bytes(data)).entries()),
                             key=lambda e: e.lexeme)
            for first_lexeme, data in encode_dictionary(entries):
                cursor.execute("INSERT INTO fulltext_dictionary (knowledge_base_id, segment_id, first_lexeme, data)"
                               " VALUES (%s, %s, %s, %s)", [kb.id, segment_id, first_lexeme, data])
            cursor.execute("UPDATE fulltext_segments SET norms = NULL WHERE knowledge_base_id = %s AND segment_id = %s",
                           [kb.id, segment_id])
    DICTIONARIES.clear()


@pytest.mark.django_db
def test_segments_written_before_per_chunk_norms_rank_the_same_and_merge_into_the_new_layout(
        in_l0: KnowledgeBase, monkeypatch: pytest.MonkeyPatch) -> None:
    """v7 以前写的段（块自带长度字节、段没有 norms）照旧可读，与新写法的段混在一起也一样；并段按新写法重写。"""
    monkeypatch.setattr(segments, "MERGE_FACTOR", 100)
    segments.compact(in_l0.id, batch=2)
    expected = _results(in_l0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT segment_id FROM fulltext_segments WHERE knowledge_base_id = %s ORDER BY first_ordinal",
                       [in_l0.id])
        ids = [int(row[0]) for row in cursor.fetchall()]
    assert len(ids) >= 3
    _rewrite_as_before_segment_norms(in_l0, ids[::2])  # 新旧相间：查询把几个段的长度字节拼在一起
    assert _results(in_l0) == expected and segments.mismatches(in_l0.id) == []
    _rewrite_as_before_segment_norms(in_l0, ids[1::2])
    assert _results(in_l0) == expected and segments.mismatches(in_l0.id) == []
    assert segments.merge_all(in_l0.id).merged == len(ids)
    with connection.cursor() as cursor:
        cursor.execute("SELECT length(norms), end_ordinal - first_ordinal FROM fulltext_segments"
                       " WHERE knowledge_base_id = %s", [in_l0.id])
        ((stored, span),) = cursor.fetchall()
        assert stored == span > 0
        cursor.execute("SELECT bool_and(get_byte(data, 0) & 16 = 16) FROM fulltext_blocks WHERE knowledge_base_id = %s",
                       [in_l0.id])
        assert cursor.fetchone()[0] in (True, None)
    assert _results(in_l0) == expected and segments.mismatches(in_l0.id) == []


@pytest.mark.django_db
def test_merge_all_respects_the_merged_segment_cap(in_l0: KnowledgeBase, monkeypatch: pytest.MonkeyPatch,
                                                   settings: Any) -> None:
    monkeypatch.setattr(segments, "MERGE_FACTOR", 100)
    settings.FULLTEXT_MAX_SEGMENT_CHUNKS = 3
    segments.compact(in_l0.id, batch=1)
    result = segments.merge_all(in_l0.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT doc_count FROM fulltext_segments WHERE knowledge_base_id = %s ORDER BY first_ordinal",
                       [in_l0.id])
        assert [row[0] for row in cursor.fetchall()] == [3, 3, 2]
    assert result.segments == 3 and result.merged == len(TEXTS)
    assert segments.mismatches(in_l0.id) == []


def _segment_content(kb: KnowledgeBase) -> tuple[list[str], list[tuple[int, ...]], list[tuple[str, int]]]:
    """知识库唯一一个段的逻辑内容：词位、每条倒排 (词位下标, 序号, 词频, 长度)、按首字的 df。与词典块怎么切无关。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT segment_id FROM fulltext_segments WHERE knowledge_base_id = %s", [kb.id])
        (segment_id,) = [row[0] for row in cursor.fetchall()]
        lexemes, postings = segments._read_segments(cursor, kb.id, [segment_id],
                                                    segments._segment_norms(cursor, kb.id, [segment_id]))
        cursor.execute("SELECT prefix, df FROM fulltext_prefixes WHERE knowledge_base_id = %s ORDER BY prefix",
                       [kb.id])
        prefixes = [(prefix, int(df)) for prefix, df in cursor.fetchall()]
    rows = sorted(zip(postings.terms.tolist(), postings.docs.tolist(), postings.title_tf.tolist(),
                      postings.body_tf.tolist(), postings.norms.tolist(), strict=True))
    return lexemes, rows, prefixes


@pytest.mark.django_db
def test_a_merge_read_and_written_slice_by_slice_equals_a_merge_in_one_piece(
        in_l0: KnowledgeBase, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    """并段按词位分片读写（内存只与一片有关）：分成多片与一次读完并出的段逻辑上相同，检索结果与分数相同，
    核对无差异；删掉的分块在两种并法里都被清出去；写到一半被杀的并段整个回滚。"""
    monkeypatch.setattr(segments, "MERGE_FACTOR", 100)
    segments.compact(in_l0.id, batch=1)
    doomed = Document.objects.filter(knowledge_base=in_l0).order_by("filename").first()
    assert doomed is not None
    with django_capture_on_commit_callbacks(execute=True):
        document_delete(principal=SYSTEM_PRINCIPAL, document_id=doomed.id)
    with transaction.atomic():
        segments.merge_all(in_l0.id)
        whole = _segment_content(in_l0), _results(in_l0)
        transaction.set_rollback(True)
    slices: list[int] = []
    real = segments._slices

    def counted(*args: Any) -> Any:
        found = real(*args)
        slices.append(len(found))
        return found

    monkeypatch.setattr(segments, "_SLICE_DOCS", 1)  # 一个分块一片：切点取遍词典块
    monkeypatch.setattr(segments, "_slices", counted)
    # 写完第一片就被杀：整个并段回滚，各段原样、照常可查
    real_write = segments._write_terms
    written: list[int] = []

    def killed_after_one(*args: Any) -> None:
        if written:
            raise RuntimeError("killed")
        written.append(1)
        real_write(*args)

    with monkeypatch.context() as patch:
        patch.setattr(segments, "_write_terms", killed_after_one)
        with pytest.raises(RuntimeError):
            segments.merge_all(in_l0.id)
    assert _count("fulltext_segments", in_l0) > 1
    assert _results(in_l0) == whole[1]
    assert segments.mismatches(in_l0.id) == []
    slices.clear()
    segments.merge_all(in_l0.id)
    assert slices and slices[0] > 1
    assert (_segment_content(in_l0), _results(in_l0)) == whole
    assert segments.mismatches(in_l0.id) == []
    assert _count("fulltext_deleted", in_l0) == 0


def _segment_ids(kb: KnowledgeBase) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT segment_id FROM fulltext_segments WHERE knowledge_base_id = %s ORDER BY 1", [kb.id])
        return [int(row[0]) for row in cursor.fetchall()]


@pytest.mark.django_db
def test_cached_dictionaries_never_serve_a_rebuilt_segment_its_old_blocks(in_l0: KnowledgeBase, settings: Any) -> None:
    """词典块按段的代号缓存：整库重建从 0 重新编段号、内容换了（这里换成 jieba 切法），进程里留着的旧目录与旧块
    不会被当成新段的；结果与清空缓存后重查的逐一相同。"""
    DICTIONARIES.clear()
    segments.compact(in_l0.id, batch=3)
    before = _segment_ids(in_l0)
    first = _results(in_l0)
    assert DICTIONARIES.cached_bytes > 0
    assert _results(in_l0) == first  # 第二遍全部命中缓存
    settings.FULLTEXT_ANALYZER = "jieba"
    bm25.reindex_chunks(kb_id=in_l0.id)
    segments.rebuild(in_l0.id)
    assert set(_segment_ids(in_l0)) & set(before)  # 段号确实重用了
    with_old_cache = _results(in_l0)
    DICTIONARIES.clear()
    assert _results(in_l0) == with_old_cache
    settings.FULLTEXT_DICTIONARY_CACHE_MB = 0  # 不缓存词典块：每次都从库里取，结果不变
    DICTIONARIES.clear()
    assert _results(in_l0) == with_old_cache and DICTIONARIES.cached_bytes == 0


@pytest.mark.django_db
def test_cached_entries_answer_exactly_like_the_blocks_and_skip_the_database(in_l0: KnowledgeBase) -> None:
    """精确词的词条缓存（含“这个段里没有它”）给出的条目与每次从词典块里找的逐一相同；第二次不查库。"""
    segments.compact(in_l0.id, batch=3)
    present = sorted({term.lexeme for text in TEXTS
                      for term in analysis.parse_query(text[:40], analyzer="bigram").terms})
    # 比段里全部首词都小的、中间没有的、比全部都大的
    keys = [(lexeme, False) for lexeme in [*present, "\x01", "不存在的词位", "\U0010fff0"]]
    with connection.cursor() as cursor:
        cursor.execute("SELECT segment_id, generation FROM fulltext_segments WHERE knowledge_base_id = %s"
                       " ORDER BY segment_id", [in_l0.id])
        segs = [(int(segment_id), int(generation)) for segment_id, generation in cursor.fetchall()]
        expected: dict[tuple[str, bool], list[tuple[int, Any]]] = {key: [] for key in keys}
        for segment_id, block_keys, data in SegmentDictionaries().blocks(cursor, in_l0.id, segs, keys):
            block = DictionaryBlock(data)
            for key in block_keys:
                expected[key] += [(segment_id, entry) for entry in [block.find(key[0])] if entry]
        cache = SegmentDictionaries()
        first = cache.entries(cursor, in_l0.id, segs, keys)
        with CaptureQueriesContext(connection) as queries:
            second = cache.entries(cursor, in_l0.id, segs, keys)
    assert len(segs) > 1
    assert first == second == expected
    assert sum(len(found) for found in first.values()) > len(present) // 2
    assert not first[("不存在的词位", False)]
    assert len(queries) == 0


def test_cached_posting_blocks_answer_like_the_database_and_fetch_only_what_is_missing(
        kb_factory: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """常见词的倒排块按 (段的代号, 词位) 记在段缓存里：再查不取块；额度变大要更多块时只取后面缺的那几块；
    结果与清空缓存、不缓存（上限 0）时逐一相同。"""
    # 300 个分块都含“复查”（3 个倒排块），长度各不相同；“病人”只在 20 个里（倒排内联在词典里）
    kb, _ = _compacted_kb(kb_factory(), 300, every=15, spread=17)
    fetched: list[tuple[list[int], list[int]]] = []
    real = segment_cache.fetchall_prepared

    def recording(conn: Any, sql: str, params: Any, **kwargs: Any) -> Any:
        if "fulltext_blocks" in sql:  # 取倒排块的那条（词典块、按首字的 df 也走这里）
            fetched.append((list(params[2]), list(params[3])))  # 各词从第几块取、取到第几块之前
        return real(conn, sql, params, **kwargs)

    monkeypatch.setattr(segment_cache, "fetchall_prepared", recording)
    query = analysis.parse_query("复查 病人", analyzer="bigram")

    def search(budget: int, *, clear: bool = False) -> list[tuple[int, float]]:
        settings.BM25_MAX_POSTINGS = budget
        if clear:
            DICTIONARIES.clear()
        return [(hit.chunk_id, hit.value) for hit in fulltext_search(kb, query, SearchFilters(), limit=50).hits]

    small = search(200, clear=True)
    assert fetched == [([0], [2])]  # “复查”读前 2 块
    assert search(200) == small and len(fetched) == 1
    large = search(400)
    assert fetched[1:] == [([2], [3])]  # 只取缺的第 3 块
    assert search(400) == large and len(fetched) == 2
    assert search(200, clear=True) == small and search(400, clear=True) == large
    settings.FULLTEXT_DICTIONARY_CACHE_MB = 0
    assert search(200) == small and search(400) == large


def test_the_dictionary_block_cache_stays_within_its_budget(settings: Any) -> None:
    settings.FULLTEXT_DICTIONARY_CACHE_MB = 1
    cache = SegmentDictionaries()
    block = bytes(400 * 1024)
    for first in ("a", "b", "c"):
        cache._remember({(0, 7, first): block})
    assert cache.cached_bytes == 2 * len(block)  # 第三块进来时最早的一块让位
    assert set(cache._cached({(0, 7, "a"): None, (0, 7, "b"): None, (0, 7, "c"): None})) == {(0, 7, "b"), (0, 7, "c")}
    cache._remember({(0, 7, "huge"): bytes(2 * 1024 * 1024)})  # 超过整个上限的块不缓存
    assert cache.cached_bytes == 2 * len(block)
    # 词条与块在同一个 LRU、同一份预算里：固定开销加内联倒排
    cache._remember_entries({(7, "肝"): Entry("肝", 3, b"\x01\x02"), (7, "无"): None})
    assert cache.cached_bytes == 2 * len(block) + 2 * 200 + 2
    assert cache._cached_entries([(0, 7)], [("肝", False), ("无", False), ("别的", False)]) == {
        (0, ("肝", False)): Entry("肝", 3, b"\x01\x02"), (0, ("无", False)): None}
    # 一个词的倒排块前缀：固定开销加各块；变长时换掉旧的，不重复计数
    cache._store({(7, "复查", 2): (bytes(10),)})
    cache._store({(7, "复查", 2): (bytes(10), bytes(5))})
    assert cache.cached_bytes == 2 * len(block) + 2 * 200 + 2 + 200 + 15
    # 按首字的 df：固定开销
    cache._store({(7, "肝", 1): 12})
    assert cache.cached_bytes == 2 * len(block) + 2 * 200 + 2 + 200 + 15 + 200


@pytest.mark.django_db(transaction=True)
def test_the_schedule_rebuilds_bloated_indexes_and_drops_an_unfinished_reindex(
        in_l0: KnowledgeBase, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """批量写入合并完 L0 空了、并段删掉了旧段，索引还停在高峰的大小：定时任务只重建远大于按现有的行估出的大小的
    索引；上一次中途被杀的 REINDEX CONCURRENTLY 留下的无效索引（写入还要维护它）一并删掉。检索结果不变。"""
    # 唯一索引在重复值上建不成：CONCURRENTLY 失败时留下无效索引，与被杀的 REINDEX CONCURRENTLY 留下的一样
    with pytest.raises(IntegrityError), connection.cursor() as cursor:
        cursor.execute("CREATE UNIQUE INDEX CONCURRENTLY fulltext_l0_pkey_ccnew ON fulltext_l0 (knowledge_base_id)")
    settings.FULLTEXT_IDLE_MERGE_MINUTES = 0  # 只看收缩
    segments.compact(in_l0.id)
    expected = _results(in_l0)

    def invalid_indexes() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexrelid::regclass::text FROM pg_index"
                           " WHERE indrelid = 'fulltext_l0'::regclass AND NOT indisvalid")
            return [row[0] for row in cursor.fetchall()]

    def files() -> dict[str, int]:
        """每个索引的文件号：重建（REINDEX）才换，autovacuum 不换。"""
        with connection.cursor() as cursor:
            cursor.execute("SELECT relname, pg_relation_filenode(oid) FROM pg_class WHERE relname = ANY(%s)",
                           [[state.name for state in segments.index_states()]])
            return dict(cursor.fetchall())

    assert invalid_indexes() == ["fulltext_l0_pkey_ccnew"]
    segments.merge_all(in_l0.id)  # 并段删掉旧段：段的表的主键留下空页
    before, built = {state.name: state.size for state in segments.index_states()}, files()
    monkeypatch.setattr(segments, "INDEX_SHRINK_MIN_BYTES", 1 << 40)
    maintain_fulltext()  # 没到门槛：不重建，只删掉无效的索引
    assert invalid_indexes() == [] and files() == built
    monkeypatch.setattr(segments, "INDEX_SHRINK_MIN_BYTES", 0)
    maintain_fulltext()
    after, rebuilt = {state.name: state.size for state in segments.index_states()}, files()
    # 只看本库的 L0：别的 transaction=True 测试留下的 L0 行不随 Django 的 flush 清掉（L0 不是 Django 的表）
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fulltext_l0 WHERE knowledge_base_id = %s", [in_l0.id])
        assert cursor.fetchone()[0] == 0
    assert sum(after.values()) < sum(before.values()) and after.keys() == before.keys()
    assert all(rebuilt[name] != built[name] for name in ("fulltext_dictionary_pkey", "fulltext_blocks_pkey"))
    assert _results(in_l0) == expected and segments.mismatches(in_l0.id) == []
    with transaction.atomic():
        assert not segments.shrink_indexes()  # VACUUM 与 REINDEX CONCURRENTLY 不能在事务里执行


def test_an_index_counts_as_bloated_only_well_above_its_fresh_size() -> None:
    """新建大小的估计：B 树条目头 8 字节加各列、按 8 字节对齐、4 字节行指针、页面填 90%（倒排块主键：uuid、段号、
    6 字节的词位、块号，重建后实测每条 49.7 B）；GIN 按每行 16 KB 宽估。1.5 倍以上、又过了门槛才算停在高峰。"""
    assert segments.fresh_index_bytes("btree", 900, [16, 4, 7, 4]) == pytest.approx(900 * 44 / 0.9)
    assert segments.fresh_index_bytes("gin", 3, [1000]) == 3 * 16 * 1024
    fresh = 10_000_000.0
    assert not segments.IndexState("i", "t", int(1.4 * fresh), fresh).bloated  # 随机插入的稳态约 1.3 倍
    assert segments.IndexState("i", "t", int(1.6 * fresh), fresh).bloated
    assert not segments.IndexState("i", "t", segments.INDEX_SHRINK_MIN_BYTES, 0.0).bloated


def _segment_docs(kb: KnowledgeBase) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT doc_count FROM fulltext_segments WHERE knowledge_base_id = %s ORDER BY first_ordinal",
                       [kb.id])
        return [int(row[0]) for row in cursor.fetchall()]


@pytest.mark.django_db
def test_an_idle_knowledge_base_gets_its_segments_merged_and_ranks_the_same(
        in_l0: KnowledgeBase, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    """闲下来（L0 空、最新的段写出超过 RAG_FULLTEXT_IDLE_MERGE_MINUTES）的库，维护任务把几个段并成一个；
    还在写的（段是刚写出的，或 L0 里还有分块）不动。检索结果与分数逐一相同。"""
    settings.FULLTEXT_IDLE_MERGE_MINUTES = 30
    segments.compact(in_l0.id, batch=3)
    expected = _results(in_l0)
    assert _segment_docs(in_l0) == [3, 3, 2]
    maintain_fulltext()  # 段刚写出：还不算闲
    assert _segment_docs(in_l0) == [3, 3, 2]

    def age_segments() -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE fulltext_segments SET created_at = now() - interval '31 minutes'"
                           " WHERE knowledge_base_id = %s", [in_l0.id])

    age_segments()
    _upload(in_l0, "late.txt", TEXTS[0], django_capture_on_commit_callbacks)  # L0 里还有分块：还在写
    assert segments.idle_due(30) == []
    Document.objects.filter(knowledge_base=in_l0, filename="late.txt").delete()
    assert segments.idle_due(30) == [in_l0.id]
    maintain_fulltext()
    assert _segment_docs(in_l0) == [8]
    assert _results(in_l0) == expected
    assert segments.mismatches(in_l0.id) == []
    settings.FULLTEXT_IDLE_MERGE_MINUTES = 0  # 关掉之后不并（这里也没有可并的了）
    maintain_fulltext()
    assert _segment_docs(in_l0) == [8]


def test_idle_merges_take_the_newest_segments_without_rewriting_a_big_one_for_a_few_chunks() -> None:
    """闲时合并选段：批量导入留下的分层的段并成一个（最后那一小批不挡住前面的）；零星写入的小段不让大段整个
    重写；并出的段不超过上限。"""
    def run(sizes: list[int]) -> list[int] | None:
        starts = list(itertools.accumulate([0, *sizes]))
        picked = segments._idle_run([segments._Segment(i, starts[i], starts[i + 1], size)
                                     for i, size in enumerate(sizes)])
        return None if picked is None else [segment.docs for segment in picked]

    tiered = [40_000, 40_000, 5_000, 5_000, 5_000, 5_000]
    assert run(tiered) == tiered
    assert run([*tiered, 300]) == [*tiered, 300]
    assert run([150_000, 10]) is None  # 一个大段后面跟一个小段：不为 10 个分块重写 15 万个
    assert run([150_000, 15_000, 10]) == [15_000, 10]
    assert run([120_000, 60_000, 30_000]) == [120_000, 60_000, 30_000]
    assert run([600_000, 300_000, 150_000]) == [300_000, 150_000]  # 再收 60 万就超过一个段的上限（100 万）
    # 100 万块按默认策略写出来的 25 个 4 万块的段（bench/pages/fulltext_scale.md）：闲下来并成一个
    assert run([40_000] * 25) == [40_000] * 25 and run([40_000] * 26) == [40_000] * 25
    assert run([5_000]) is None and run([]) is None


def _tables_bytes(tables: Sequence[str], *, main_forks: bool = True) -> int:
    """表的数据与索引。``main_forks``：只算主文件——VACUUM 给小表添的空闲空间映射（3 页）比这里的表本身还大；
    否则连附属文件一起（VACUUM FULL 换的新文件还没有它们，几页的表重写之后页数可能不变）。"""
    measure = f"{segments._HEAP_BYTES_SQL} + pg_indexes_size(c.oid)" if main_forks else "pg_total_relation_size(c.oid)"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT sum({measure}) FROM pg_class c WHERE c.relname = ANY(%s)", [list(tables)])
        return int(cursor.fetchone()[0])


def _constraints(tables: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """这几张表的约束（表、名字、种类、定义；PostgreSQL 18 起非空也是有名字的约束）与索引（名字、定义）。"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT conrelid::regclass::text, conname, contype::text, pg_get_constraintdef(oid)"
                       " FROM pg_constraint WHERE conrelid = ANY(%s::regclass[])"
                       " UNION ALL SELECT tablename, indexname, 'index', indexdef FROM pg_indexes"
                       " WHERE tablename = ANY(%s) ORDER BY 1, 2, 3", [list(tables), list(tables)])
        return [tuple(row) for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_small_segment_tables_are_repacked_after_a_merge(in_l0: KnowledgeBase,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """并段先写新段再删旧段，旧段的页只留给以后的写入：段的表还小时维护任务并过之后用 VACUUM FULL 重写紧凑，
    文件变小、结果不变。"""
    segments.compact(in_l0.id, batch=3)
    expected = _results(in_l0)
    assert segments.merge_idle(in_l0.id).merged == 3
    before = _tables_bytes(segments._SEGMENT_TABLES, main_forks=False)
    assert segments.repack_tables() == list(segments._SEGMENT_TABLES)
    assert _tables_bytes(segments._SEGMENT_TABLES, main_forks=False) < before
    assert _results(in_l0) == expected and segments.mismatches(in_l0.id) == []


@pytest.mark.django_db(transaction=True)
def test_big_merged_tables_are_swapped_for_compact_copies(kb_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """段的表大了（这里把门槛调成 0）就不用 VACUUM FULL（整个重写期间挡住查询），改成拷贝换表：空页多的并段表拷进
    新表、换上，文件变小，表的形状（列、主键、非空约束的名字）与结果都不变，换过的表照常写。查询的快照事务或
    合并开着时等不到锁：等锁超时就放弃，什么也不改；它们结束后再来就换上。"""
    monkeypatch.setattr(segments, "REPACK_MAX_BYTES", 0)
    monkeypatch.setattr(segments, "INDEX_SHRINK_MIN_BYTES", 0)
    monkeypatch.setattr(segments, "_REPACK_LOCK_TIMEOUT", "200ms")
    kb = kb_factory()
    document = Document.objects.create(knowledge_base=kb, filename="x.txt", status=Document.Status.COMPLETED,
                                       chunk_count=3000)
    # 3,000 个各不相同的词（词典几十行、并段之后一半的页是空的）加一个人人都有的常见词（倒排块，只有两页）
    DocumentChunk.objects.bulk_create(
        DocumentChunk(knowledge_base=kb, document=document, chunk_index=i, chunk_text=f"条目{i}",
                      search_vector=f"'t{i:05d}':1 'common':{2 + i % 3}", search_length=3) for i in range(3000))
    assert segments.compact(kb.id, batch=1000).segments == 3
    queries = ["common", "t00042", "t02999 t01000", "t0"]

    def results() -> list[list[tuple[int, float]]]:
        return [[(hit.chunk_id, round(hit.value, 9)) for hit in fulltext_search(
            kb, analysis.parse_query(query, analyzer="bigram"), SearchFilters(), limit=20).hits] for query in queries]

    expected = results()
    assert segments.merge_idle(kb.id).merged == 3
    shape = _constraints(segments.MERGED_TABLES)
    before = _tables_bytes(segments.MERGED_TABLES)
    def holding(sql: str, params: list[Any], *, snapshot: bool) -> None:
        """另一个连接开着一个事务（``snapshot``：查询的快照事务）、执行 ``sql`` 后不结束时，换表等锁超时、返回 []。"""
        started, done = threading.Event(), threading.Event()

        def hold() -> None:
            try:
                with bm25._snapshot_cursor() if snapshot else transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(sql, params)
                    started.set()
                    done.wait(10)
            finally:
                connection.close()

        thread = threading.Thread(target=hold)
        thread.start()
        assert started.wait(10)
        try:
            assert segments.repack_tables() == []
        finally:
            done.set()
            thread.join()

    holding("SELECT count(*) FROM fulltext_dictionary", [], snapshot=True)  # 正在读的查询：换表的最后一刻等它读完
    holding("SELECT 1 FROM fulltext_kb_stats WHERE knowledge_base_id = %s FOR UPDATE", [kb.id],  # 正在合并的库
            snapshot=False)
    assert _tables_bytes(segments.MERGED_TABLES) == before
    with connection.cursor() as cursor:  # 运维给词典挂了子表（分区、继承、Citus 同理）：换表会丢掉它，不换
        cursor.execute("CREATE TABLE fulltext_dictionary_child () INHERITS (fulltext_dictionary)")
    try:
        assert "fulltext_dictionary" not in segments.repack_tables()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE fulltext_dictionary_child")
    with connection.cursor() as cursor:  # 只读副本的连接用的另一个角色：只有词典的 SELECT 授权
        cursor.execute("DROP ROLE IF EXISTS ragservice_test_reader")  # 角色是整个集群的：上一次中途失败留下的
        cursor.execute("CREATE ROLE ragservice_test_reader NOLOGIN")
        cursor.execute("GRANT SELECT ON fulltext_dictionary TO ragservice_test_reader")
    try:
        repacked = segments.repack_tables()
        with connection.cursor() as cursor:
            cursor.execute("SELECT has_table_privilege('ragservice_test_reader', 'fulltext_dictionary', 'SELECT'),"
                           " has_table_privilege('ragservice_test_reader', 'fulltext_dictionary', 'INSERT')")
            assert cursor.fetchone() == (True, False)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP OWNED BY ragservice_test_reader")
            cursor.execute("DROP ROLE ragservice_test_reader")
    assert "fulltext_dictionary" in repacked and set(repacked) <= set(segments.MERGED_TABLES)
    assert _tables_bytes(segments.MERGED_TABLES) < before
    assert _constraints(segments.MERGED_TABLES) == shape
    assert results() == expected and segments.mismatches(kb.id) == []
    assert segments.repack_tables() == []  # 刚换过的表不再有空页
    DocumentChunk.objects.create(knowledge_base=kb, document=document, chunk_index=3000, chunk_text="后来的",
                                 search_vector="'t00042':1 'late':2", search_length=2)
    segments.compact(kb.id)
    assert segments.merge_idle(kb.id).merged == 2 and segments.mismatches(kb.id) == []


def test_a_settled_knowledge_base_is_searched_in_one_statement_that_checks_its_state(
        kb_factory: Any, settings: Any) -> None:
    """合并完的库（L0 与删除集都空）：记下统计行与段表之后，普通查询不开事务、只发回表那一条语句（它同时核对
    记下的状态）；结果与清空缓存、走快照时逐一相同。新写入、删除、并段之后状态不成立：这一遍作废，在快照里重查，
    新分块立刻查得到、删掉的分块查不到；只出现在新分块里的词（按记下的统计 df 为 0，提前结束）也一样。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 10_000
    kb, document = _compacted_kb(kb_factory(), 40, every=4, spread=5)
    statements: list[str] = []

    def recording(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    def search(text: str) -> list[tuple[int, float]]:
        with connection.execute_wrapper(recording):
            hits = fulltext_search(kb, analysis.parse_query(text, analyzer="bigram"), SearchFilters(), limit=10).hits
        return [(hit.chunk_id, hit.value) for hit in hits]

    DICTIONARIES.clear()
    first = search("复查 病人")
    state = DICTIONARIES.settled(kb.id)
    assert state is not None and state.chunk_count == 40 and len(state.segments) == 1
    statements.clear()
    assert search("复查 病人") == first
    assert len(statements) == 1 and statements[0].startswith("SELECT v.ok")
    # 库里没有的词：按记下的统计答“没有”之前，单独一条语句核对它还成立
    statements.clear()
    assert search("不存在的词") == [] and len(statements) == 1 and DICTIONARIES.settled(kb.id) == state
    # 过滤条件、短语查询不走这条路
    statements.clear()
    fulltext_search(kb, analysis.parse_query('"复查 病人"', analyzer="bigram"), SearchFilters(), limit=10)
    assert not any(sql.startswith("SELECT v.ok") for sql in statements)

    # 新写入（L0 不空）：记下的状态不成立，在快照里重查，新分块查得到，状态忘掉（下一个查询不再试）
    new = DocumentChunk.objects.create(knowledge_base=kb, document=document, chunk_index=40, chunk_text="复查 病人 新",
                                       search_vector="'复查':1 '病人':2 '新来':3", search_length=3)
    statements.clear()
    assert new.id in [chunk_id for chunk_id, _ in search("复查 病人")]
    assert any(sql.startswith("SELECT v.ok") for sql in statements) and DICTIONARIES.settled(kb.id) is None
    # 只在新分块里的词：按记下的统计它不在库里，也不能就此回答“没有”
    segments.compact(kb.id)
    search("复查")
    assert DICTIONARIES.settled(kb.id) is not None
    newer = DocumentChunk.objects.create(knowledge_base=kb, document=document, chunk_index=41, chunk_text="另外",
                                         search_vector="'另外':1", search_length=1)
    assert [chunk_id for chunk_id, _ in search("另外")] == [newer.id]
    # 删除：删掉的分块立刻查不到
    segments.compact(kb.id)
    search("复查")
    assert DICTIONARIES.settled(kb.id) is not None
    top = search("病人")[0][0]
    DocumentChunk.objects.filter(id=top).delete()
    assert top not in [chunk_id for chunk_id, _ in search("病人")]
    # 并段之后段表变了：结果与清空缓存时相同
    segments.compact(kb.id)
    after = search("复查 病人")
    DICTIONARIES.clear()
    assert search("复查 病人") == after


@pytest.mark.django_db
def test_a_settled_search_that_needs_the_norms_of_a_merged_away_segment_is_redone_in_a_snapshot(
        kb_factory: Any, settings: Any) -> None:
    """记下的段表过时了（段已被并掉），而它的长度字节不在缓存里（被挤出，块与词条还在）：取不到长度字节，
    这一遍作废、在快照里重查，结果与清空缓存时相同。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 10_000
    kb, document = _compacted_kb(kb_factory(), 40, every=4, spread=5)
    query = analysis.parse_query("复查 病人", analyzer="bigram")

    def search() -> list[tuple[int, float]]:
        return [(hit.chunk_id, hit.value) for hit in fulltext_search(kb, query, SearchFilters(), limit=10).hits]

    DICTIONARIES.clear()
    search()
    state = DICTIONARIES.settled(kb.id)
    assert state is not None
    DocumentChunk.objects.create(knowledge_base=kb, document=document, chunk_index=40, chunk_text="复查 病人",
                                 search_vector="'复查':1 '病人':2", search_length=2)
    segments.compact(kb.id)
    assert segments.merge_all(kb.id).merged == 2
    for _, generation in state.segments:
        assert DICTIONARIES._blocks.pop((generation, 4), None) is not None  # 模拟被挤出缓存
    got = search()
    assert DICTIONARIES.settled(kb.id) != state
    DICTIONARIES.clear()
    assert got == search()
