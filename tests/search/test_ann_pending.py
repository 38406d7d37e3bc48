"""有自己的图的知识库，新写入的分块先不进图（``DocumentChunk.ann_pending``）：检索精确扫描它们并与图的结果合并，
后台任务（``search.ann.flush_pending``）再把它们插进图里；那条只改一列的 UPDATE 不动全文引擎（触发器 v5）。
攒着的分块有上限，旧条件的图不收暂不进图的分块、由定时同步在旁边重建。"""

from __future__ import annotations

from io import StringIO
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django_q.models import Schedule
from django_q.signals import pre_enqueue

from documents.filters import SearchFilters
from documents.models import DocumentChunk
from ops.tasks import VECTOR_FLUSH_SCHEDULE, flush_vector_pending
from search import ann
from search.retrieval import vector_search
from tests.documents.test_api import BID_TEXT, upload
from tests.search.test_shared_ann import SECOND_TEXT, _stored_vector

pytestmark = pytest.mark.django_db

THIRD_TEXT = "# 付款方式\n\n合同签订后支付百分之三十预付款，到货验收合格后支付百分之六十，质保期满支付余款。\n"


def _own_graph(kb: Any, *, pending_clause: bool = True) -> None:
    """测试事务里建知识库自己的图（定时任务走 CONCURRENTLY）；``pending_clause`` 为假时建 documents.0015
    之前的旧条件。"""
    sql = ann.kb_index_sql(kb, concurrently=False)
    if not pending_clause:
        sql = sql.replace(" AND NOT ann_pending", "")
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # 外键检查先做完，否则不能在同一事务里建索引
        cursor.execute(sql)


def _kb_with_own_graph(settings: Any, client_rw: Any, kb_factory: Any, run_on_commit: Any) -> Any:
    """一份文档、已有自己的图的知识库（小库也按大知识库的路径走）：之后写进来的分块先不进图。"""
    settings.EXACT_SEARCH_MAX_CHUNKS = 0
    kb = kb_factory()
    upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit)
    _own_graph(kb)
    return kb


def _in_graph(kb: Any, query: np.ndarray) -> set[int]:
    """只走知识库自己的图（HNSW 的迭代扫描、排序关掉）能取到的分块：小库上就是图里的全部分块。"""
    index = ann.kb_index_state(kb.id)
    assert index is not None and index.excludes_pending
    dim = kb.embedding_dimension
    sql = (f"SELECT c.id FROM document_chunks c WHERE {ann._graph_predicate(kb, 'c.')}"
           f" ORDER BY (c.embedding::halfvec({dim})) <=> %s::halfvec({dim}) LIMIT 100")
    vector = "[" + ",".join(f"{x:.7g}" for x in query.tolist()) + "]"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(*ann.hnsw_settings_statement(200))
        cursor.execute(f"EXPLAIN {sql}", [vector])
        assert index.name in "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute(sql, [vector])
        return {int(row[0]) for row in cursor.fetchall()}


def _engine_rows() -> tuple[Any, ...]:
    """全文引擎里记着分块的三处：L0、序号表、删除集。"""
    with connection.cursor() as cursor:
        rows = []
        for sql in ("SELECT chunk_id, lexemes::text FROM fulltext_l0 ORDER BY chunk_id",
                    "SELECT chunk_id, ordinal FROM fulltext_docs ORDER BY chunk_id",
                    "SELECT ordinal FROM fulltext_deleted ORDER BY ordinal"):
            cursor.execute(sql)
            rows.append(cursor.fetchall())
    return tuple(rows)


def test_new_chunks_are_found_before_and_after_they_enter_the_graph(settings, client_rw, kb_factory, run_on_commit,
                                                                    fake_embedder):
    settings.EXACT_SEARCH_MAX_CHUNKS = 0  # 小库也按大知识库的路径走
    kb = kb_factory()
    first = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    _own_graph(kb)
    second = upload(client_rw, kb, "b.md", SECOND_TEXT.encode(), run_on_commit).json()["document_id"]
    # 第一份文档写入时还没有自己的图：进共享图；第二份先不进自己的图
    assert not DocumentChunk.objects.filter(document_id=first, ann_pending=True).exists()
    new = set(DocumentChunk.objects.filter(document_id=second).values_list("id", flat=True))
    assert new and set(DocumentChunk.objects.filter(ann_pending=True).values_list("id", flat=True)) == new

    target = DocumentChunk.objects.filter(document_id=second).first()
    assert target is not None
    query = _stored_vector(target)
    assert not _in_graph(kb, query) & new
    # 检索照样找得到：图的结果与暂不进图的分块的精确扫描合并
    hits, method = vector_search(kb, query, SearchFilters(), 1)
    assert (method, hits[0].chunk_id) == ("kb_index:halfvec", target.id)
    everything = {hit.chunk_id for hit in vector_search(kb, query, SearchFilters(), 50)[0]}
    assert new <= everything
    assert everything == {hit.chunk_id for hit in vector_search(kb, query, SearchFilters(), 50, exact=True)[0]}

    engine = _engine_rows()
    assert ann.flush_pending() == len(new)
    assert not DocumentChunk.objects.filter(ann_pending=True).exists()
    assert new <= _in_graph(kb, query)  # 那条 UPDATE 把它们插进了图
    assert _engine_rows() == engine  # 只改 ann_pending 的 UPDATE 不动全文引擎（触发器 v5）
    hits, method = vector_search(kb, query, SearchFilters(), 1)
    assert (method, hits[0].chunk_id) == ("kb_index:halfvec", target.id)
    assert ann.flush_pending() == 0  # 幂等


def test_an_update_that_changes_the_terms_still_reindexes(settings, client_rw, kb_factory, run_on_commit,
                                                          fake_embedder):
    """触发器 v5 只跳过全文输入一行都没变的 UPDATE：改了词位的照旧先删、再插（进 L0，等下次合并）。"""
    kb = kb_factory()
    document = upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    chunk = DocumentChunk.objects.filter(document_id=document).first()
    assert chunk is not None
    with connection.cursor() as cursor:
        cursor.execute("UPDATE document_chunks SET search_vector = %s, search_length = 1, ann_pending = true"
                       " WHERE id = %s", ["'维保':1B", chunk.id])
        cursor.execute("SELECT lexemes::text FROM fulltext_l0 WHERE chunk_id = %s", [chunk.id])
        assert cursor.fetchall() == [("{维保}",)]


def test_pending_chunks_are_bounded_and_the_setting_turns_it_off(settings, client_rw, kb_factory, run_on_commit,
                                                                 fake_embedder):
    kb = _kb_with_own_graph(settings, client_rw, kb_factory, run_on_commit)
    second = upload(client_rw, kb, "b.md", SECOND_TEXT.encode(), run_on_commit).json()["document_id"]
    pending = DocumentChunk.objects.filter(document_id=second).count()
    settings.ANN_PENDING_MAX_CHUNKS = pending  # 攒满了：下一份文档直接进图
    third = upload(client_rw, kb, "c.md", THIRD_TEXT.encode(), run_on_commit).json()["document_id"]
    assert not DocumentChunk.objects.filter(document_id=third, ann_pending=True).exists()
    assert DocumentChunk.objects.filter(ann_pending=True).count() == pending

    flush_vector_pending(str(kb.id))  # 任务入口
    settings.ANN_PENDING_MAX_CHUNKS = 0  # 关掉：写入时直接进图
    fourth = upload(client_rw, kb, "d.md", SECOND_TEXT.replace("五年", "三年").encode(), run_on_commit).json()
    assert not DocumentChunk.objects.filter(ann_pending=True).exists()
    assert DocumentChunk.objects.filter(document_id=fourth["document_id"], shared_ann=False).exists()


@pytest.mark.django_db(transaction=True)
def test_a_graph_without_the_pending_clause_takes_every_chunk_until_rebuilt(settings: Any, client_rw, kb_factory,
                                                                              run_on_commit, fake_embedder) -> None:
    """documents.0015 之前建的图收全部分块：写入照旧直接进图；定时同步在旁边按新条件重建它。"""
    settings.EXACT_SEARCH_MAX_CHUNKS = 0
    settings.ANN_KB_INDEX_MIN_CHUNKS = 1
    kb = kb_factory()
    try:
        upload(client_rw, kb, "a.md", BID_TEXT.encode(), run_on_commit)
        _own_graph(kb, pending_clause=False)
        old = ann.kb_index_state(kb.id)
        assert old is not None and old.valid and not old.excludes_pending
        second = upload(client_rw, kb, "b.md", SECOND_TEXT.encode(), run_on_commit).json()["document_id"]
        assert not DocumentChunk.objects.filter(document_id=second, ann_pending=True).exists()
        target = DocumentChunk.objects.filter(document_id=second).first()
        assert target is not None
        hits, method = vector_search(kb, _stored_vector(target), SearchFilters(), 1)
        assert (method, hits[0].chunk_id) == ("kb_index:halfvec", target.id)

        assert ann.kb_indexes_sync()["built"] == [str(kb.id)]
        state = ann.kb_index_state(kb.id)
        assert state is not None and state.valid and state.excludes_pending
        third = upload(client_rw, kb, "c.md", THIRD_TEXT.encode(), run_on_commit).json()["document_id"]
        assert DocumentChunk.objects.filter(document_id=third, ann_pending=True).exists()
    finally:
        ann.kb_index_drop(kb_id=kb.id)  # 提交了的索引不随测试回滚：留着会让别的测试的同步多删一个


def test_the_flush_runs_every_minute_on_the_fast_queue(settings) -> None:
    schedule = Schedule.objects.get(name=VECTOR_FLUSH_SCHEDULE)
    assert (schedule.func, schedule.minutes, schedule.cluster) == ("ops.tasks.flush_vector_pending", 1,
                                                                   settings.FAST_QUEUE)


def test_a_process_that_wrote_a_quarter_of_the_limit_queues_a_flush(settings, client_rw, kb_factory, run_on_commit,
                                                                     fake_embedder):
    """写入每攒到上限的四分之一就给快队列排一次插图（测试里任务同步执行），不等每分钟的定时任务。"""
    kb = _kb_with_own_graph(settings, client_rw, kb_factory, run_on_commit)
    packages: list[dict[str, Any]] = []

    def record(sender: str, task: dict[str, Any], **_: Any) -> None:
        packages.append(dict(task))

    settings.ANN_PENDING_MAX_CHUNKS = 4  # 四分之一是 1 块：这份文档一写完就排
    pre_enqueue.connect(record, dispatch_uid="test.ann_pending.enqueued")
    try:
        second = upload(client_rw, kb, "b.md", SECOND_TEXT.encode(), run_on_commit).json()["document_id"]
    finally:
        pre_enqueue.disconnect(dispatch_uid="test.ann_pending.enqueued")
    flushes = [package for package in packages if package["func"] == "ops.tasks.flush_vector_pending"]
    assert [(package["args"], package["cluster"]) for package in flushes] == [((str(kb.id),), settings.FAST_QUEUE)]
    assert DocumentChunk.objects.filter(document_id=second).exists()
    assert not DocumentChunk.objects.filter(ann_pending=True).exists()  # 排上的任务已经把它们插进了图


def test_the_flush_command_reports_and_resumes(settings, client_rw, kb_factory, run_on_commit, fake_embedder):
    """``manage.py flush_ann_pending``：批量导入之后立刻插完，报告每个知识库插了多少；再运行没有剩下的。"""
    kb = _kb_with_own_graph(settings, client_rw, kb_factory, run_on_commit)
    second = upload(client_rw, kb, "b.md", SECOND_TEXT.encode(), run_on_commit).json()["document_id"]
    pending = DocumentChunk.objects.filter(document_id=second, ann_pending=True).count()
    assert pending
    out = StringIO()
    call_command("flush_ann_pending", "--kb", kb.name, stdout=out)
    assert f"知识库 {kb.id}：{pending} 个分块待进图，插了 {pending} 个" in out.getvalue()
    assert not DocumentChunk.objects.filter(ann_pending=True).exists()
    out = StringIO()
    call_command("flush_ann_pending", stdout=out)
    assert out.getvalue().strip() == "没有还没进图的分块"
