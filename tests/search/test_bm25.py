"""全文检索的 BM25：SQL 打分与 Python 重算一致、候选剪枝不改变结果、知识库级统计在任意操作序列下精确、
两个 worker 并发写入同一知识库后统计仍精确、只含常见词的查询也有结果、覆盖率。"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.db import close_old_connections, connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from documents.filters import SearchFilters
from documents.models import Document, DocumentChunk
from documents.services import document_delete, document_reindex, document_upload
from infra.principal import SYSTEM_PRINCIPAL
from infra.routers import search_connection
from knowledge.models import KnowledgeBase
from knowledge.services import knowledge_base_delete
from raglib import analysis
from raglib import bm25 as raglib_bm25
from raglib.analysis import ParsedQuery, QueryTerm
from raglib.postings import Postings, impacts
from search import bm25, segments
from search.chunk_terms import chunk_terms
from search.retrieval import fulltext_scores, fulltext_search
from search.segment_cache import DICTIONARIES
from tests.sample_docs import MEDICAL_TEXTS
from tests.search.oracle import analysed_terms, chunk_vectors, engine_terms, matching_chunks


def parse_query(query: str) -> ParsedQuery:
    """按当前设置（``RAG_FULLTEXT_ANALYZER``，个别测试改成 jieba）解析查询，与服务的检索路径一致。"""
    return analysis.parse_query(query, analyzer=django_settings.FULLTEXT_ANALYZER)

# 全文引擎的每一张表（都以 knowledge_base_id 开头）
FULLTEXT_TABLES = ("fulltext_kb_stats", "fulltext_l0", "fulltext_docs", "fulltext_deleted", "fulltext_deleted_terms",
                   "fulltext_segments", "fulltext_dictionary", "fulltext_prefixes", "fulltext_blocks")

TEXTS = MEDICAL_TEXTS


def _upload(kb: KnowledgeBase, name: str, text: str, capture: Any) -> Document:
    with capture(execute=True):
        return document_upload(kb=kb, filename=name, upload=io.BytesIO(text.encode()), metadata={}, chunking={})


def _stored_terms(kb: KnowledgeBase) -> dict[int, tuple[dict[str, float], int]]:
    """每个可检索分块：{词位: 加权词频}（标题位置按 RAG_BM25_TITLE_WEIGHT 计）与词数，从重新切出的 tsvector 解析。"""
    from django.conf import settings

    rows = {}
    vectors = chunk_vectors(kb.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, search_length FROM document_chunks"
                       " WHERE knowledge_base_id = %s AND role <> 'parent'", [kb.id])
        for chunk_id, length in cursor.fetchall():
            literal = vectors[chunk_id]
            terms: dict[str, float] = {}
            for lexeme, positions in re.findall(r"'((?:[^']|'')+)':([\dA-D,]+)", literal or ""):
                for position in positions.split(","):
                    weight = settings.BM25_TITLE_WEIGHT if position.endswith("A") else 1.0
                    terms[lexeme.replace("''", "'")] = terms.get(lexeme.replace("''", "'"), 0.0) + weight
            rows[chunk_id] = (terms, length)
    return rows


def _python_bm25(kb: KnowledgeBase, query: str) -> dict[int, float]:
    from django.conf import settings

    chunks = _stored_terms(kb)
    n = len(chunks)
    avgdl = sum(length for _, length in chunks.values()) / n
    scores: dict[int, float] = {}
    for term in parse_query(query).terms:
        df = sum(term.lexeme in terms for terms, _ in chunks.values())
        if not df:
            continue
        size = n if term.han else max(n, raglib_bm25.WORD_IDF_MIN_CHUNKS)  # 字母、数字的词在小库里按至少这么多块算
        idf = math.log(1 + (size - df + 0.5) / (df + 0.5))
        for chunk_id, (terms, length) in chunks.items():
            tf = terms.get(term.lexeme, 0.0)
            if tf:
                norm = settings.BM25_K1 * (1 - settings.BM25_B + settings.BM25_B * length / avgdl)
                scores[chunk_id] = scores.get(chunk_id, 0.0) + term.count * idf * tf * (settings.BM25_K1 + 1) / (
                    tf + norm)
    return scores


@pytest.fixture
def medical(kb_factory: Any, fake_embedder: Any, django_capture_on_commit_callbacks: Any) -> KnowledgeBase:
    kb = kb_factory()
    for i, text in enumerate(TEXTS):
        _upload(kb, f"doc{i}.txt", text, django_capture_on_commit_callbacks)
    return kb


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["高血压能吃党参吗", "乙肝 肝功能 复查", "hypertension blood pressure", "饮食"])
def test_sql_scores_equal_python_bm25(medical: KnowledgeBase, query: str) -> None:
    expected = _python_bm25(medical, query)
    found = fulltext_search(medical, parse_query(query), SearchFilters(), limit=50).hits
    assert {hit.chunk_id for hit in found} == set(expected)
    for hit in found:
        assert hit.value == pytest.approx(expected[hit.chunk_id], rel=1e-4)
    assert [hit.value for hit in found] == sorted((hit.value for hit in found), reverse=True)


@pytest.mark.django_db
@pytest.mark.parametrize("query", ['"乙肝病毒" 复查', '"高血压" 饮食', '"血压"', '高血压 -党参', "乙肝 OR 胃胀",
                                   '"乙肝" "肝功能"', '"不存在的短语"', "饮食 -不存在", '"blood pressure"'])
def test_phrase_boolean_exact_hits_are_exactly_the_matching_chunks(medical: KnowledgeBase, query: str) -> None:
    """短语、布尔、exact：命中的正是满足 tsquery 的分块（逐个分块在数据库里检查），分数是它们的 BM25 分——回表前按
    必需词去掉的候选（``_with_required``）一个也不该是满足 tsquery 的。"""
    parsed = parse_query(query)
    assert parsed.type != "plain"
    matching = matching_chunks(medical.id, parsed.tsquery)
    found = fulltext_search(medical, parsed, SearchFilters(), limit=50).hits
    assert {hit.chunk_id for hit in found} == matching
    expected = _python_bm25(medical, query)
    for hit in found:
        assert hit.value == pytest.approx(expected[hit.chunk_id], rel=1e-4)


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["高血压能吃党参吗", "乙肝 肝功能 复查", "hypertension blood pressure", "肝"])
def test_scores_from_chunk_terms_equal_the_postings_scores(medical: KnowledgeBase, query: str) -> None:
    """EVIDENCE-OWN：给名单外候选补分数用的 fulltext_scores（由分块自己的正排算）与倒排表上的 SQL 打分一致；
    一个查询词都没有的分块为 0。"""
    parsed = parse_query(query)
    found = fulltext_search(medical, parsed, SearchFilters(), limit=50)
    every = list(DocumentChunk.objects.filter(knowledge_base=medical).values_list("id", flat=True))
    scores = fulltext_scores(medical, parsed, every, found.statistics)
    listed = {hit.chunk_id: hit.value for hit in found.hits}
    for chunk_id, score in scores.items():
        assert score == pytest.approx(listed.get(chunk_id, 0.0), rel=1e-4, abs=1e-9)


@pytest.mark.django_db
def test_postings_budget_keeps_the_rarest_terms(medical: KnowledgeBase, settings: Any) -> None:
    query = parse_query("党参 饮食")
    settings.BM25_MAX_POSTINGS = 1_000_000
    assert len(fulltext_search(medical, query, SearchFilters(), limit=10).hits) >= 3
    settings.BM25_MAX_POSTINGS = 1  # 只读得起一个词的倒排：留下最稀有的“党参”（只有一个分块含它）
    hits = fulltext_search(medical, query, SearchFilters(), limit=10).hits
    assert [h.chunk_id for h in hits] == list(DocumentChunk.objects.filter(
        knowledge_base=medical, chunk_text__contains="党参").values_list("id", flat=True))


@pytest.mark.django_db
def test_prefix_term_beyond_the_budget_is_read_in_part(medical: KnowledgeBase, settings: Any) -> None:
    query = parse_query("肝")  # 孤立的单字：以“肝”开头的一段词位（前缀词）
    assert [t.prefix for t in query.terms] == [True]
    whole = fulltext_search(medical, query, SearchFilters(), limit=50).hits
    assert len(whole) == 2
    settings.BM25_MAX_POSTINGS = 1  # 那一段读不起，又是唯一的词：只读额度内的一行，仍然有结果
    part = fulltext_search(medical, query, SearchFilters(), limit=50).hits
    assert len(part) == 1
    assert {h.chunk_id for h in part} <= {h.chunk_id for h in whole}


def _scored(df: int, lexeme: str, prefix: bool = False, idf: float = 1.0) -> raglib_bm25.ScoredTerm:
    return raglib_bm25.ScoredTerm(QueryTerm(lexeme, prefix=prefix), df, idf, idf)


def test_allot_postings_reads_rare_terms_whole_and_splits_the_rest() -> None:
    terms = [_scored(10, "a"), _scored(500, "b"), _scored(5000, "c"), _scored(90000, "d")]
    reads = raglib_bm25.allot_postings(terms, 3000)
    # a 整条读完；剩下 2990 平分给 3 个词：b 的 500 用不完，余量留给 c、d
    assert [(r.scored.term.lexeme, r.rows, r.truncated) for r in reads] == [
        ("a", 10, False), ("b", 500, False), ("c", 1245, True), ("d", 1245, True)]
    assert sum(r.rows for r in reads) <= 3000
    # 截断的额度按 IDF 分：贡献大的词读得更深
    weighted = raglib_bm25.allot_postings([_scored(5000, "c", idf=3.0), _scored(9000, "d", idf=1.0)], 2000)
    assert [(r.scored.term.lexeme, r.rows) for r in weighted] == [("c", 1500), ("d", 500)]


def test_allot_postings_skips_prefix_terms_it_cannot_afford() -> None:
    terms = [_scored(10, "a"), _scored(4000, "肝", prefix=True), _scored(9000, "c")]
    # 读不起的前缀词跳过，它那份额度留给后面的词
    assert [(r.scored.term.lexeme, r.rows) for r in raglib_bm25.allot_postings(terms, 3000)] == [("a", 10), ("c", 2990)]
    # 只有前缀词且一个也读不起：仍读最稀有的那个，但最多读满额度（工作量有界）
    only = [_scored(4000, "肝", prefix=True)]
    assert [(r.scored.term.lexeme, r.rows) for r in raglib_bm25.allot_postings(only, 100)] == [("肝", 100)]
    assert raglib_bm25.allot_postings([], 100) == []


@pytest.mark.django_db
def test_truncated_common_term_reads_its_highest_impact_postings(kb_factory: Any, fake_embedder: Any,
                                                                 django_capture_on_commit_callbacks: Any,
                                                                 settings: Any) -> None:
    kb = kb_factory()
    # 每个分块都含一次“复查”，长度各不相同：只读 2 行时应读到最短的两个，正好是完整 BM25 的前两名
    for i in range(6):
        _upload(kb, f"d{i}.txt", "复查" + "。".join(["患者情况稳定"] * (i * 3 + 1)),
                django_capture_on_commit_callbacks)
    expected = _python_bm25(kb, "复查")
    best_two = sorted(expected, key=lambda chunk_id: -expected[chunk_id])[:2]
    settings.BM25_MAX_POSTINGS = 2
    hits = fulltext_search(kb, parse_query("复查"), SearchFilters(), limit=10).hits
    assert [hit.chunk_id for hit in hits] == best_two
    for hit in hits:
        assert hit.value == pytest.approx(expected[hit.chunk_id], rel=1e-4)  # 读到的行照常精确计分


@pytest.mark.django_db
def test_query_of_only_common_terms_still_returns_results(kb_factory: Any, fake_embedder: Any,
                                                          django_capture_on_commit_callbacks: Any) -> None:
    kb = kb_factory()
    for i in range(6):
        _upload(kb, f"d{i}.txt", f"患者需要复查 第{i}次", django_capture_on_commit_callbacks)
    hits = fulltext_search(kb, parse_query("患者需要复查"), SearchFilters(), limit=10).hits
    assert len(hits) == 6  # 每个分块都含这些词：IDF 很低但仍为正，照样排序返回


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["乙肝 复查", '"乙肝病毒" 复查', "高血压 -党参"])
def test_ts_rank_cd_stays_selectable(medical: KnowledgeBase, settings: Any, query: str) -> None:
    """``ts_rank_cd`` 排序在 BM25 的候选上重排（分块不存 tsvector，对原文重新切词）：小库里与逐块扫全库、
    按 ``ts_rank_cd`` 排出的前 10 名相同。"""
    settings.FULLTEXT_RANKING = "ts_rank_cd"
    parsed = parse_query(query)
    hits = fulltext_search(medical, parsed, SearchFilters(), limit=10).hits
    assert hits and all(0 < hit.value <= 1 for hit in hits)
    vectors = chunk_vectors(medical.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT v.id, ts_rank_cd(v.sv::tsvector, %s::tsquery, 32) AS rank"
                       " FROM unnest(%s::bigint[], %s::text[]) AS v(id, sv) WHERE v.sv::tsvector @@ %s::tsquery"
                       " ORDER BY rank DESC, v.id LIMIT 10",
                       [parsed.rank_tsquery or parsed.tsquery, list(vectors), list(vectors.values()), parsed.tsquery])
        expected = cursor.fetchall()
    assert [(hit.chunk_id, pytest.approx(hit.value)) for hit in hits] == [(int(i), rank) for i, rank in expected]


@pytest.mark.django_db
def test_coverage_is_low_for_a_query_in_another_language(medical: KnowledgeBase) -> None:
    chinese = fulltext_search(medical, parse_query("乙肝病毒复查"), SearchFilters(), limit=5)
    english = fulltext_search(medical, parse_query("how often should hepatitis carriers recheck the virus"),
                              SearchFilters(), limit=5)
    assert chinese.coverage > 0.6  # 跨词的 bigram（“毒复”）库里没有，按最大 IDF 计入分母
    assert english.coverage < 0.3


def test_coverage_function() -> None:
    terms = [QueryTerm("a"), QueryTerm("b", count=2)]
    assert raglib_bm25.coverage(terms, {("a", False): 5, ("b", False): 5}, 10) == pytest.approx(1.0)
    assert raglib_bm25.coverage(terms, {}, 10) == 0.0
    partial = raglib_bm25.coverage(terms, {("a", False): 1}, 10)
    assert 0 < partial < 1
    assert raglib_bm25.coverage([], {}, 10) == 0.0


def test_coverage_of_a_tiny_knowledge_base_counts_at_least_coverage_min_chunks() -> None:
    """1 块的库里库里有的词 df = N，按库自己的 N 算 IDF 只有库里没有的词的五分之一：四个词里三个在块里，覆盖率也只有
    0.38，闸门（0.3~0.6）几乎关掉全文一路。按至少 COVERAGE_MIN_CHUNKS 块算时是 0.70；够大的库照旧按自己的 N。"""
    terms = [QueryTerm(word) for word in "abcd"]
    present = {(word, False): 1 for word in "abc"}
    tiny = raglib_bm25.coverage(terms, present, 1)
    assert tiny == pytest.approx(raglib_bm25.coverage(terms, present, raglib_bm25.COVERAGE_MIN_CHUNKS))
    assert tiny > 0.6
    large = raglib_bm25.COVERAGE_MIN_CHUNKS * 3
    common = {(word, False): large // 2 for word in "abc"}
    present_weight = 3 * raglib_bm25.idf(large // 2, large)
    weighted = present_weight / (present_weight + raglib_bm25.idf(0, large))
    assert raglib_bm25.coverage(terms, common, large) == pytest.approx(weighted)


def test_word_idf_of_a_tiny_knowledge_base_counts_at_least_word_idf_min_chunks() -> None:
    """1 块的库里库里有的英文词 df = N，按库自己的 N 算 IDF 只有库里没有的词的五分之一，问的正是这一块的问题匹配程度
    （分数 ÷ 可能的最高分）也很低：字母、数字的词按至少 WORD_IDF_MIN_CHUNKS 块算。汉字的词照旧按库自己的 N；
    够大的库两种词都是 Lucene 的 IDF。"""
    floor = raglib_bm25.WORD_IDF_MIN_CHUNKS
    word, han = QueryTerm("scotland"), QueryTerm("苏格")
    assert not word.han and han.han and QueryTerm("肝", prefix=True).han and not QueryTerm("1990").han
    assert raglib_bm25.term_idf(word, 1, 1) == pytest.approx(raglib_bm25.idf(1, floor))
    assert raglib_bm25.term_idf(word, 1, 1) > 0.6 * raglib_bm25.term_idf(word, 0, 1)  # 按 N = 1 算只有 0.2 倍
    assert raglib_bm25.term_idf(han, 1, 1) == pytest.approx(raglib_bm25.idf(1, 1))
    terms = [QueryTerm(w) for w in ("what", "did", "scotland", "export")]
    present = {(w, False): 1 for w in ("did", "scotland", "export")}
    scored = raglib_bm25.score_terms(terms, present, 1, raglib_bm25.Bm25Params(1.2, 0.75, 2.0))
    best = raglib_bm25.max_score(terms, present, 1, 1.2)
    assert sum(term.idf for term in scored) * 2.2 / best > 0.6  # 三个词全饱和时的匹配程度；按 N = 1 算是 0.38
    assert raglib_bm25.max_score(terms, present, 1, 1.2) == pytest.approx(
        raglib_bm25.max_score(terms, present, floor, 1.2))
    for term in (word, han):
        assert raglib_bm25.term_idf(term, 3, floor) == pytest.approx(math.log(1 + (floor - 3 + 0.5) / 3.5))


# ---------------------------------------------------------------- 统计永远精确（hypothesis）

Operation = tuple[str, int]
OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["add", "add", "delete", "reindex", "raw_delete", "raw_update", "compact",
                               "compact_killed"]),
              st.integers(0, 20)),
    min_size=1, max_size=10,
)


class _Killed(Exception):
    """模拟合并进程在写出新段之后、并段之前被杀：事务回滚。"""


def _assert_deleted_never_returned(kb: KnowledgeBase, gone: dict[int, str]) -> None:
    """删掉的分块（id → 原文）用它自己的原文去搜，也不会被返回。"""
    for chunk_id, text in list(gone.items())[-3:]:
        hits = fulltext_search(kb, parse_query(text[:30]), SearchFilters(), limit=50).hits
        assert chunk_id not in {hit.chunk_id for hit in hits}


def _assert_settled_path_agrees(kb: KnowledgeBase) -> None:
    """SETTLED-STATE-CHECKED：在快照里查一遍（记下合并完的状态，若是），再查一遍（合并完时走一条语句的那条路），
    两遍结果逐一相同。"""
    query = parse_query("高血压 乙肝 饮食 复查 hypertension liver")
    DICTIONARIES.remember_settled(kb.id, None)
    snapshot = fulltext_search(kb, query, SearchFilters(), limit=20).hits
    assert fulltext_search(kb, query, SearchFilters(), limit=20).hits == snapshot


@pytest.mark.django_db
@hsettings(max_examples=30, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(operations=OPERATIONS, cleanup=st.booleans())
def test_statistics_equal_a_recount_after_any_sequence(operations: list[Operation], cleanup: bool,
                                                       kb_factory: Any, fake_embedder: Any, settings: Any,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       django_capture_on_commit_callbacks: Any) -> None:
    """STATISTICS-EXACT 与 DELETED-NEVER-RETURNED：摄取、删除、重新索引、直接删行、直接改行、合并（含中途被杀的合并）
    任意交错，每一步之后存储的统计与倒排都等于按分块重算的，删掉的分块无论合并前后都不会被检索到。

    直接改行有两种（触发器 v6）：只改 ``ann_pending`` 的 UPDATE（向量图的插入做的就是这个，全文引擎什么也不做）；
    同一条语句里给一个分块换了原文与全文输入、其余分块只改 ``ann_pending``（只有那一个被撤出、重新登记）。
    分块不存 tsvector，所以每一步另查引擎登记的词项正是按原文重新切出来的（``mismatches`` 只核对引擎内部与分块行）。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 1000  # 合并只在 compact 步骤里发生
    monkeypatch.setattr(segments, "MERGE_FACTOR", 2)  # 两个段就并：短序列里也有并段与清除删除
    monkeypatch.setattr(segments, "_SLICE_DOCS", 2)  # 并段按词位分成几片读写
    kb = kb_factory()
    documents: list[Document] = []
    gone: dict[int, str] = {}

    def forget(document: Document) -> None:
        gone.update(DocumentChunk.objects.filter(document=document).values_list("id", "chunk_text"))

    for kind, number in operations:
        if kind == "add":
            text = "\n\n".join(TEXTS[(number + j) % len(TEXTS)] for j in range(1 + number % 3))
            documents.append(_upload(kb, f"f{len(documents)}.md", f"# 标题{number}\n\n{text}",
                                     django_capture_on_commit_callbacks))
        elif documents and kind == "delete":
            document = documents.pop(number % len(documents))
            forget(document)
            with django_capture_on_commit_callbacks(execute=True):
                document_delete(principal=SYSTEM_PRINCIPAL, document_id=document.id)
        elif documents and kind == "reindex":
            document = documents[number % len(documents)]
            forget(document)
            with django_capture_on_commit_callbacks(execute=True):
                document_reindex(principal=SYSTEM_PRINCIPAL, document_id=document.id)
        elif kind == "raw_delete":
            chunk = DocumentChunk.objects.filter(knowledge_base=kb).order_by("id").first()
            if chunk is not None:
                gone[chunk.id] = chunk.chunk_text
                chunk.delete()  # 绕过服务直接删行：统计照样由触发器维护
        elif kind == "raw_update":
            with connection.cursor() as cursor:
                # number 为奇数时把最早那个分块的原文、元数据与全文输入换成最晚那个的：一条语句里既有改了全文输入
                # 的行（给出 search_vector，触发器重新登记它），也有只改 ann_pending 的（触发器不运行）
                cursor.execute("SELECT chunk_text, metadata::text FROM document_chunks WHERE knowledge_base_id = %s"
                               " ORDER BY id DESC LIMIT 1", [kb.id])
                last = cursor.fetchone()
                vector, length = chunk_terms(*last) if last else ("", 0)
                swap = number % 2 == 1 and last is not None
                cursor.execute(
                    "UPDATE document_chunks c SET ann_pending = NOT c.ann_pending,"
                    " chunk_text = CASE WHEN %s AND c.id = e.first THEN %s ELSE c.chunk_text END,"
                    " metadata = CASE WHEN %s AND c.id = e.first THEN %s::jsonb ELSE c.metadata END,"
                    " search_vector = CASE WHEN %s AND c.id = e.first THEN %s END,"
                    " search_length = CASE WHEN %s AND c.id = e.first THEN %s ELSE c.search_length END"
                    " FROM (SELECT min(id) AS first FROM document_chunks WHERE knowledge_base_id = %s) e"
                    " WHERE c.knowledge_base_id = %s",
                    [swap, last and last[0], swap, last and last[1], swap, vector, swap, length, kb.id, kb.id])
        elif kind == "compact":
            segments.compact(kb.id, batch=1 + number % 3)
        elif kind == "compact_killed":
            with monkeypatch.context() as patch:
                patch.setattr(segments, "_merge_due", lambda *args: (_ for _ in ()).throw(_Killed()))
                with contextlib.suppress(_Killed):  # 还没有统计行的空库不走到那一步
                    segments.compact(kb.id)
        assert segments.mismatches(kb.id) == []
        assert engine_terms(kb.id) == analysed_terms(kb.id)
        _assert_deleted_never_returned(kb, gone)
        _assert_settled_path_agrees(kb)
    if cleanup:
        with django_capture_on_commit_callbacks(execute=True):
            knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=kb.id)
        assert not DocumentChunk.objects.filter(knowledge_base=kb).exists()
        assert segments.mismatches(kb.id) == []


@pytest.mark.django_db
def test_rebuild_repairs_tampered_segments(medical: KnowledgeBase) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM fulltext_dictionary WHERE ctid = (SELECT min(ctid) FROM fulltext_dictionary"
                       " WHERE knowledge_base_id = %s)", [medical.id])
        cursor.execute("UPDATE fulltext_kb_stats SET chunk_count = chunk_count + 7 WHERE knowledge_base_id = %s",
                       [medical.id])
    assert segments.mismatches(medical.id)
    segments.rebuild(medical.id)
    assert segments.mismatches(medical.id) == []


@pytest.mark.django_db
def test_rebuild_fulltext_switches_analyzer_and_keeps_statistics(medical: KnowledgeBase, settings: Any) -> None:
    from django.core.management import call_command

    settings.FULLTEXT_ANALYZER = "jieba"
    call_command("rebuild_fulltext", "--kb", str(medical.id), stdout=io.StringIO())
    assert segments.mismatches(medical.id) == []
    assert fulltext_search(medical, parse_query("高血压"), SearchFilters(), limit=5).hits


@pytest.mark.django_db(transaction=True)
def test_two_writers_and_a_running_compaction_keep_exact_statistics(kb_factory: Any, fake_embedder: Any,
                                                                      settings: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """两个线程（各自的数据库连接）同时向同一知识库摄取、删除，第三个线程不停地合并：写入只追加 L0 行、不排队等
    任何共享的行，删除与合并交错（被合并取走的 L0 行、已进段的分块）也不丢、不重。第四个线程不停地把并段表拷贝换表
    （门槛调成 0），第五个不停地查：换表与合并、写入、查询交错，谁也不报错，最后的统计照样精确。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 1000  # 合并只由第三个线程做
    monkeypatch.setattr(segments, "MERGE_FACTOR", 2)
    monkeypatch.setattr(segments, "REPACK_MAX_BYTES", 0)
    monkeypatch.setattr(segments, "INDEX_SHRINK_MIN_BYTES", 0)
    monkeypatch.setattr(segments, "_HEAP_BLOAT_RATIO", 0.0)  # 每一轮都换
    monkeypatch.setattr(segments, "_REPACK_LOCK_TIMEOUT", "100ms")
    kb = kb_factory()
    errors: list[BaseException] = []
    swaps: list[list[str]] = []
    barrier = threading.Barrier(5)
    writing = threading.Event()
    writing.set()

    def worker(offset: int) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait()
                mine = []
                for i in range(6):
                    text = TEXTS[(offset + i) % len(TEXTS)] + f" 编号{offset}-{i}"
                    mine.append(document_upload(kb=kb, filename=f"w{offset}-{i}.txt",
                                                upload=io.BytesIO(text.encode()), metadata={}, chunking={}))
                    if i % 2:
                        document_delete(principal=SYSTEM_PRINCIPAL, document_id=mine[i - 1].id)
            except BaseException as exc:  # 断言放在主线程
                errors.append(exc)
            finally:
                close_old_connections()
        return run

    def looping(step: Callable[[], Any]) -> Callable[[], None]:
        """写入还在进行时一遍遍做 ``step`` 的线程（合并、换表、检索）。"""
        def run() -> None:
            try:
                barrier.wait()
                while writing.is_set():
                    step()
            except BaseException as exc:
                errors.append(exc)
            finally:
                close_old_connections()
        return run

    threads = [threading.Thread(target=worker(offset)) for offset in (0, 3)]
    others = [threading.Thread(target=looping(step)) for step in (
        lambda: segments.compact(kb.id, batch=2),
        lambda: swaps.append(segments.repack_tables()),
        lambda: fulltext_search(kb, parse_query("高血压 饮食 编号"), SearchFilters(), limit=10))]
    for thread in [*threads, *others]:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    writing.clear()
    for thread in others:
        thread.join(timeout=120)
    assert not errors
    assert any(swaps)  # 约 50 轮里换了 10 次左右
    assert Document.objects.filter(knowledge_base=kb, status=Document.Status.COMPLETED).count() == 6
    assert segments.mismatches(kb.id) == []
    segments.compact(kb.id)
    assert segments.mismatches(kb.id) == []


@pytest.mark.django_db
def test_hard_deleting_a_knowledge_base_removes_its_statistics(medical: KnowledgeBase) -> None:
    """管理员直接删库（ORM 级联）时，触发器与级联删除的先后顺序不能留下孤儿统计或外键错误。"""
    kb_id = medical.id
    medical.delete()
    with connection.cursor() as cursor:
        for table in FULLTEXT_TABLES:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE knowledge_base_id = %s", [kb_id])
            assert cursor.fetchone()[0] == 0, table


@pytest.mark.django_db
def test_shortlist_falls_back_when_filters_remove_the_best_chunks(medical: KnowledgeBase,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """先回表的只是分数最高的一批；过滤条件把它们全排除时，要对全部候选再做一次，结果不丢。"""

    monkeypatch.setattr(bm25, "_BM25_SHORTLIST", 1)
    query = parse_query("高血压 饮食 肝功能 乙肝 复查")
    everything = fulltext_search(medical, query, SearchFilters(), limit=50).hits
    assert len(everything) > 4
    last = DocumentChunk.objects.get(pk=everything[-1].chunk_id)
    only_last = fulltext_search(medical, query, SearchFilters(document_ids=(str(last.document_id),)), limit=1).hits
    assert [(h.chunk_id, round(h.value, 6)) for h in only_last] == [(last.id, round(everything[-1].value, 6))]
    # 没有过滤时，先取一批的结果与全部打分的前几名相同
    assert [h.chunk_id for h in fulltext_search(medical, query, SearchFilters(), limit=2).hits] == [
        h.chunk_id for h in everything[:2]]



@pytest.mark.django_db
def test_unfiltered_search_fills_limit_past_chunks_of_unfinished_documents(medical: KnowledgeBase) -> None:
    """没有过滤条件时回表的第一批只有 limit 个：其中有不在范围里的（文档不是 completed）就接着查下一批，结果照样
    取满，与这些分块不存在时的排序相同。"""
    query = parse_query("高血压 饮食 肝功能 乙肝 复查")
    everything = fulltext_search(medical, query, SearchFilters(), limit=50).hits
    assert len(everything) > 4
    best = DocumentChunk.objects.get(pk=everything[0].chunk_id)
    Document.objects.filter(pk=best.document_id).update(status=Document.Status.PROCESSING)
    hidden = set(DocumentChunk.objects.filter(document_id=best.document_id).values_list("id", flat=True))
    expected = [(h.chunk_id, h.value) for h in everything if h.chunk_id not in hidden][:3]
    assert len(expected) == 3
    assert [(h.chunk_id, h.value) for h in fulltext_search(medical, query, SearchFilters(), limit=3).hits] == expected

@pytest.mark.django_db
def test_unfiltered_plain_search_checks_scope_without_reading_chunk_rows(medical: KnowledgeBase) -> None:
    """没有过滤条件的普通查询按引擎记着的文档检查范围（L0 里的与段里的分块都是），不读 document_chunks；
    有过滤条件或短语查询时照旧回表。两种方式的结果相同。"""
    plain, phrase = parse_query("高血压 饮食 肝功能"), parse_query('"高血压"')
    documents = SearchFilters(document_ids=tuple(str(d) for d in Document.objects.filter(
        knowledge_base=medical).values_list("id", flat=True)))

    def run(query: ParsedQuery, filters: SearchFilters) -> tuple[list[tuple[int, float]], bool]:
        with CaptureQueriesContext(search_connection()) as captured:
            hits = fulltext_search(medical, query, filters, limit=10).hits
        statements = [query["sql"] for query in captured.captured_queries]
        return [(h.chunk_id, h.value) for h in hits], any("document_chunks" in sql for sql in statements)

    for _ in ("L0", "segments"):
        unfiltered, read_chunks = run(plain, SearchFilters())
        assert unfiltered and not read_chunks
        assert run(plain, documents) == (unfiltered, True)
        assert run(phrase, SearchFilters())[1]
        segments.compact(medical.id)


@pytest.mark.parametrize("seed", range(20))
def test_scope_check_batches_are_the_full_ranking_cut_at_ties(seed: int) -> None:
    """分批给出的下标连起来就是完整排序（分数降序、键升序），每批的末尾都不在同分段中间。"""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    scores = rng.integers(0, 40, n).astype(np.float64) / 7  # 大量同分
    docs = rng.permutation(n).astype(np.int64) - n // 3  # 段里的序号与 L0 的负键混在一起
    limit = int(rng.integers(1, 30))
    first = int(rng.choice([limit, max(limit * bm25._BM25_FIRST_BATCH, bm25._BM25_FIRST_MIN)]))
    batches = list(bm25._batches(docs, scores, limit, first))
    assert np.array_equal(np.concatenate(batches), np.lexsort((docs, -scores)))
    assert len(batches[0]) >= min(n, first)
    for earlier, later in itertools.pairwise(batches):
        assert scores[earlier[-1]] > scores[later[0]]



@pytest.mark.parametrize("seed", range(30))
def test_trim_keeps_the_strongest_rows_of_each_truncated_term(seed: int) -> None:
    """截断读取的词每位只留影响力最高的 rows 条，同影响力按序号、再按读入先后（同一位上同一 doc 有几条时，
    partition 找不出唯一的界，走稳定排序那条路）；rows 可以是 0；不截断的词原样保留。对照逐位排序的直白写法。
    每隔几个种子序号跨到 2^31、一位上两万条。"""
    rng = np.random.default_rng(seed)
    slots, n = int(rng.integers(4, 6)), 20_000
    spread = 2**31 - 1  # 位 3 + 影响力 15 + 序号 31 + 下标 15 位，超过 63
    if seed % 3:
        slots, n, spread = int(rng.integers(1, 6)), int(rng.integers(1, 400)), 60
    terms = rng.integers(0, slots, n)
    # 负数是 L0 的键；同一位上同一 doc 可以出现几次（前缀词的几个词位）
    docs = rng.choice(rng.integers(-20, spread, 40), n)
    postings = Postings(terms, docs, rng.integers(0, 4, n), rng.integers(0, 30, n), rng.integers(0, 256, n))
    reads = []
    for _ in range(slots):
        term = raglib_bm25.ScoredTerm(QueryTerm("词"), int(rng.integers(1, 500)), 1.0, 1.0)
        reads.append(raglib_bm25.TermRead(term, int(rng.integers(0, term.df + 1))))
    strength = impacts(postings.title_tf, postings.body_tf, postings.norms).astype(np.int64)
    keep = np.ones(n, dtype=bool)
    for slot, read in enumerate(reads):
        members = np.flatnonzero(terms == slot)
        if read.truncated:
            keep[members[np.lexsort((docs[members], -strength[members]))][read.rows:]] = False
    trimmed = bm25._trim(postings, reads)
    assert trimmed.terms.tolist() == terms[keep].tolist() and trimmed.docs.tolist() == docs[keep].tolist()
    assert trimmed.norms.tolist() == postings.norms[keep].tolist()

@pytest.mark.django_db
def test_batches_of_the_scope_check_never_split_tied_candidates(kb_factory: Any, fake_embedder: Any,
                                                               django_capture_on_commit_callbacks: Any,
                                                               monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """回表检查范围分批做，批的边界落在一串同分的候选中间时延到这串的末尾：同分按分块 id 升序，与一次做完相同。"""
    settings.FULLTEXT_L0_MAX_CHUNKS = 10_000
    kb = kb_factory()
    for i in range(6):  # 同一段文字六份：分数相同
        _upload(kb, f"dup{i}.txt", TEXTS[0], django_capture_on_commit_callbacks)
    _upload(kb, "other.txt", TEXTS[1], django_capture_on_commit_callbacks)
    # 留在 L0：L0 的候选键按分块 id 倒着排（-1 - 下标），同分时候选次序与 id 次序相反，拆批就会出错
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fulltext_l0 WHERE knowledge_base_id = %s", [kb.id])
        assert cursor.fetchone()[0] == 7
    query = parse_query("高血压 饮食")
    whole = [(h.chunk_id, h.value) for h in fulltext_search(kb, query, SearchFilters(), limit=4).hits]
    assert len({value for _, value in whole}) == 1 and [c for c, _ in whole] == sorted(c for c, _ in whole)
    for name, value in (("_BM25_FIRST_BATCH", 0), ("_BM25_FIRST_MIN", 1), ("_BM25_SHORTLIST", 2)):
        monkeypatch.setattr(bm25, name, value)
    assert [(h.chunk_id, h.value) for h in fulltext_search(kb, query, SearchFilters(), limit=4).hits] == whole


@pytest.mark.django_db
def test_drop_lets_cleanup_skip_the_index_and_spares_other_knowledge_bases(
        medical: KnowledgeBase, kb_factory: Any, django_capture_on_commit_callbacks: Any, settings: Any) -> None:
    """整库清理的快路：段与统计行先整段删掉，之后删分块时触发器跳过这个库；别的库的统计不受影响。"""
    other = kb_factory()
    for i, text in enumerate(TEXTS[:3]):
        _upload(other, f"other{i}.txt", text, django_capture_on_commit_callbacks)
    _upload(medical, "late-l0.txt", TEXTS[1], django_capture_on_commit_callbacks)
    settings.FULLTEXT_L0_MAX_CHUNKS = 1000  # 再写一个留在 L0 里的：整库删除连 L0 一起删
    _upload(medical, "in-l0.txt", TEXTS[2], django_capture_on_commit_callbacks)
    assert segments.drop(medical.id, batch_segments=1) > 0  # 小批量：走完分批删除的循环
    DocumentChunk.objects.filter(knowledge_base=medical).first().delete()  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        for table in FULLTEXT_TABLES:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE knowledge_base_id = %s", [medical.id])
            assert cursor.fetchone()[0] == 0, table
    assert segments.mismatches(other.id) == []
    # 清理期间才写入的分块重新建起统计行，照常计数
    DocumentChunk.objects.filter(knowledge_base=medical).delete()
    _upload(medical, "late.txt", TEXTS[0], django_capture_on_commit_callbacks)
    assert segments.mismatches(medical.id) == []


@pytest.mark.django_db(transaction=True)
def test_snapshot_is_a_read_only_repeatable_read_transaction_that_leaves_the_connection_as_it_was() -> None:
    """引擎的快照事务在 BEGIN 里就是 REPEATABLE READ、只读；出来之后（正常结束或抛异常）同一连接上的下一个事务
    又是默认的读已提交、可写——写入不会落进只读事务。"""
    def settings_now(cursor: Any) -> tuple[str, str]:
        cursor.execute("SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')")
        return cursor.fetchone()

    for fail in (False, True):
        with contextlib.suppress(RuntimeError), bm25._snapshot_cursor() as cursor:
            assert settings_now(cursor) == ("repeatable read", "on")
            if fail:
                raise RuntimeError("查询中途出错")
        conn = search_connection()
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            assert settings_now(cursor) == ("read committed", "off")
            cursor.execute("CREATE TEMP TABLE snapshot_probe (x int) ON COMMIT DROP")
