"""向量路的近似最近邻（ANN）策略：精确扫描、知识库自己的部分 HNSW 索引、共享 HNSW 的迭代扫描。

为什么要有知识库自己的索引：按维度的共享 HNSW 图里混着所有知识库的行，只按知识库过滤时图上的近邻关系断裂，
迭代扫描召回只有 0.8~0.9；共享图按 ``ef_construction = 64`` 建，在校准过的 e5 式向量（两两余弦都在 0.85 左右，
区分度小）上即使知识库独占整表，ef_search=40 的召回也只有 0.7~0.85。知识库自己的部分索引
（``WHERE knowledge_base_id = …``）用更高的 ``ef_construction``（:data:`KB_INDEX_EF_CONSTRUCTION`）建，
配 ``RAG_ANN_EF_SEARCH``，召回 ≥ 0.95 而且比精确扫描快一个数量级（实测见 bench/README.md 的“向量路随规模”）。

选择顺序（``exact`` 未指定时由调用方按分块数决定，见 ``search.services``）：

1. 小知识库（≤ ``RAG_EXACT_SEARCH_MAX_CHUNKS``）精确扫描，召回 100%；
2. 知识库有建好的（``indisvalid``）自己的索引：走它（ef_search 取 :func:`ef_search_floor` 与候选数两倍的较大者）。
   ``vector_compression`` 为 binary 时索引里存二值量化的向量，按汉明距离多取几倍候选（``RAG_ANN_BINARY_OVERSAMPLE``），
   再用堆里存的向量精确重排；halfvec 索引给出的距离就是堆里存的向量的距离（列本身存半精度），与不压缩的索引一样直接取；
3. 否则走共享索引的迭代扫描（``RAG_HNSW_EF_SEARCH``；自己的索引还没建好）。知识库里有不在共享索引里的分块时
   （下一段）这一步换成精确扫描（``search.retrieval.SearchPlan.exact``）。

2、3 在候选数不够时（过滤太严）都退回精确扫描，候选数永远拿满。

自己的索引由 :func:`kb_indexes_sync` 维护（django-q2 定时任务）：分块数越过 ``RAG_ANN_KB_INDEX_MIN_CHUNKS`` 的
知识库 ``CREATE INDEX CONCURRENTLY``，建索引期间写入不受阻塞、检索继续走 3；知识库删除或缩到阈值一半以下时删掉。
共享索引于是只服务“自己的索引还没建好”的那段时间，所以自己的索引可用之后写进来的分块不再进共享索引
（``documents.models.DocumentChunk.shared_ann``，由 ``documents.ingestion.ann_placement`` 在写入事务里
决定）：每块只插一张图，10 万块的库上 1 个写入进程 152~184 → 356~393 块/s（bench/pages/fulltext_engine.md）。
自己的图按 :data:`KB_INDEX_EF_CONSTRUCTION` 建好之后，插入改用更小的 ``RAG_ANN_KB_INDEX_INSERT_EF_CONSTRUCTION``
（默认 64，与共享索引相同）：10 万块的库上 1 个写入进程 299~327 → 405~451 块/s，后插进来的近邻找到 0.987~0.998
（200 时 0.985~1.000）；这样插进来的节点至多占图的 1/3，库长到建图时的 1.5 倍就在旁边重建（:func:`kb_index_build`）。
这样的知识库没有可用的自己的索引时只能精确扫描（``search.retrieval.SearchPlan.exact``），所以改压缩方式时新图建在
旧图旁边、建好才换下旧图（:func:`kb_index_build`）；剩下的情形是缩到阈值一半以下删掉了索引（那时默认设置下本来就
精确扫描）、换图时删旧图与改名之间的一瞬、有人手工删了索引。

写入也不等这张图：新分块先不进图（``DocumentChunk.ann_pending``，图的部分条件是 ``NOT ann_pending``），
走图的查询另对它们精确扫描、按同一个距离式合并（:func:`kb_index_statement`），后台任务（:func:`flush_pending`）
再把它们插进图；一个知识库至多攒 ``RAG_ANN_PENDING_MAX_CHUNKS`` 块，攒满了直接进图（bench/pages/ann_pending.md）。
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import errors

from documents.models import (
    HNSW_M,
    INDEX_STATE_SQL,
    Document,
    graph_excludes_pending,
    kb_index_name,
)
from infra.locks import advisory_lock
from infra.routers import search_connection
from knowledge.models import KnowledgeBase

logger = structlog.get_logger(__name__)

# 压缩方式 → (索引表达式, 操作符类, 查询里的距离表达式)；{dim} 是白名单里的维度，{q} 是查询向量的占位，
# {center} 是二值量化前减去的知识库均值向量（见 :func:`_center_literal`）
_COMPRESSION_SQL = {
    KnowledgeBase.VectorCompression.NONE: (
        "(embedding::vector({dim}))", "vector_cosine_ops", "(c.embedding::vector({dim})) <=> {q}::vector({dim})"),
    KnowledgeBase.VectorCompression.HALFVEC: (
        "(embedding::halfvec({dim}))", "halfvec_cosine_ops", "(c.embedding::halfvec({dim})) <=> {q}::halfvec({dim})"),
    # e5 一类模型的向量共有一个很大的公共分量，直接取符号位几乎所有向量都一样（召回 0.2~0.3）；先减去本库的均值向量
    # 再量化，符号位才反映向量之间的差别。均值写进索引表达式本身，查询时从索引定义里读回，两边永远一致
    KnowledgeBase.VectorCompression.BINARY: (
        "(binary_quantize((embedding::vector({dim})) - {center}::vector({dim}))::bit({dim}))", "bit_hamming_ops",
        "binary_quantize((c.embedding::vector({dim})) - {center}::vector({dim}))::bit({dim})"
        " <~> binary_quantize({q}::vector({dim}) - {center}::vector({dim}))"),
}
_OPCLASS_COMPRESSION = {opclass: compression for compression, (_, opclass, _) in _COMPRESSION_SQL.items()}
# 知识库自己的图按这个 ef_construction 建：100k 分块上 64 → 200 让 ef_search=100 的召回从 0.92 升到 1.0，
# 建索引时间约 1.8 倍（bench/README.md）
KB_INDEX_EF_CONSTRUCTION = 200
# 图建好之后插入改用 RAG_ANN_KB_INDEX_INSERT_EF_CONSTRUCTION（``ALTER INDEX … SET``，pgvector 插入时读索引当前的值）。
# 改的同时在索引注释里记下图按多少建、当时的 relfilenode 与分块数。两件事靠它：
# * 知识库长到那时的 _GRAPH_REBUILD_GROWTH 倍就在旁边按 KB_INDEX_EF_CONSTRUCTION 重建：从 2 万块长到 100 万块的库，
#   不重建的话图里 98% 的节点是按小的值插进来的，与整张图按 64 建差不多——那样 10 万块上就有一个近邻都找不到的查询；
# * REINDEX、VACUUM FULL、pg_dump 恢复按索引当前的（插入用的）值整张重建，都换了 relfilenode：注释对不上，同样重建。
_GRAPH_MARK = "ragservice: graph built with ef_construction={ef}, relfilenode {node}, {chunks} chunks"
_GRAPH_MARK_RE = re.compile(r"ragservice: graph built with ef_construction=(\d+), relfilenode (\d+), (\d+) chunks")
# 按小的值插进来的节点至多占图的 1/3：10 万块的库先建 6.7 万块的图、再插 3.3 万块，后插进来的近邻找到的比例见
# bench/pages/ann_insert_ef.md。库一路长大时重建的总量是最终那次的 1/(1 - 1/1.5) = 3 倍，而建图（内存里一次建完）每块
# 约 0.3 ms，按 200 逐块插入约 2 ms
_GRAPH_REBUILD_GROWTH = 1.5
# ALTER INDEX … SET 要拿索引的 AccessExclusiveLock；等锁期间后来的检索（规划时要在表的每个索引上拿 AccessShareLock）
# 都排在它后面。只等这么久，拿不到（有长的写入事务）就留给下一轮同步
_ALTER_LOCK_TIMEOUT_MS = 200


_REBUILD_SUFFIX = "_rebuild"


def kb_index_rebuild_name(kb_id: uuid.UUID) -> str:
    """换压缩方式时新图先用的名字（:func:`kb_index_build`）：建好、删掉旧图之后改名为 :func:`kb_index_name`。"""
    return kb_index_name(kb_id) + _REBUILD_SUFFIX


def kb_index_lock_key(kb_id: uuid.UUID) -> str:
    """建、删一个知识库索引的会话级 advisory lock 键（``infra.locks``）。

    锁绑在执行 CREATE INDEX 的数据库会话上。worker 被硬杀（SIGKILL、OOM）时服务器端那条语句并不察觉客户端已断开，
    会继续建到结束，锁也一直由它持有：下一轮同步、ORM 代理的重投递看到锁被占用就跳过，不会把建到一半的索引删掉重来。
    django-q2 的超时则不同：它在任务里抛 SystemExit，psycopg 随即取消正在执行的语句、留下无效索引并释放锁，
    下一轮只能删掉重建——所以这个任务按 ``RAG_MAINTENANCE_TIMEOUT`` 而不是 ``RAG_TASK_TIMEOUT`` 计时
    （``ops.tasks``）。
    """
    return f"ann-index:{kb_id}"


@dataclass(frozen=True)
class KbIndex:
    """库里实际存在的一个知识库索引：压缩方式取自它的操作符类，``valid`` 为假表示 CONCURRENTLY 建到一半失败；
    ``center`` 是二值量化索引表达式里的均值向量字面量（其他压缩为空）。"""

    name: str
    compression: str
    valid: bool
    center: str = ""
    # 图的部分条件排除了还没进图的分块（``documents.models.GRAPH_PENDING_CLAUSE``）：检索要另外精确扫描它们。
    # documents.0015 之前建的图没有这一项，所有分块都在图里，直到定时同步在旁边重建
    excludes_pending: bool = False


_CENTER = re.compile(r"'(\[[-0-9.,e+ ]*\])'::vector")




def kb_index_state(kb_id: uuid.UUID) -> KbIndex | None:
    """查主库的系统目录：这个知识库有没有自己的索引、用什么压缩、是否可用（建、删索引用）。"""
    with connection.cursor() as cursor:
        cursor.execute(INDEX_STATE_SQL, [kb_index_name(kb_id)])
        return kb_index_from_row(kb_id, cursor.fetchone())


def _graph_rebuild_reason(cursor: Any, name: str, chunks: int) -> str:
    """知识库的图为什么该按建图的值在旁边重建（空串：不必）；``chunks`` 是知识库现在的分块数。"""
    cursor.execute("SELECT c.reloptions, c.relfilenode, obj_description(c.oid, 'pg_class') FROM pg_class c"
                   " WHERE c.relname = %s", [name])
    options, node, comment = cursor.fetchone()
    if _insert_ef(options) == KB_INDEX_EF_CONSTRUCTION:
        return ""  # 插入仍按建图的值（刚建好、还没改小，或运维改回了 200）：图是完整的
    mark = _GRAPH_MARK_RE.fullmatch(comment or "")
    if mark is None or int(mark[1]) != KB_INDEX_EF_CONSTRUCTION or int(mark[2]) != node:
        return "rebuilt_at_insert_ef"  # REINDEX、VACUUM FULL、pg_dump 恢复
    if chunks > int(mark[3]) * _GRAPH_REBUILD_GROWTH:
        return "grown"
    return ""


def _insert_ef(options: Sequence[str] | None) -> int:
    # pgvector 没写 ef_construction 时取 64
    return int(dict(option.split("=", 1) for option in options or []).get("ef_construction", 64))


def _set_insert_ef(cursor: Any, kb_id: uuid.UUID, name: str, chunks: int) -> bool:
    """图建好之后把插入用的 ``ef_construction`` 改成 ``RAG_ANN_KB_INDEX_INSERT_EF_CONSTRUCTION``，并在索引注释里记下
    图按多少建、当时的 relfilenode 与分块数 ``chunks``（见 :data:`_GRAPH_MARK`）。等锁超时返回 False，下一轮同步再试；
    在那之前插入照旧按建图的值，只是慢些。"""
    target = settings.ANN_KB_INDEX_INSERT_EF_CONSTRUCTION
    cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [name])
    if _insert_ef(cursor.fetchone()[0]) == target:
        return True
    try:
        with transaction.atomic():
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{_ALTER_LOCK_TIMEOUT_MS}ms"])
            cursor.execute(f"ALTER INDEX {name} SET (ef_construction = {int(target)})")
            # 持着索引的 AccessExclusiveLock，relfilenode 在提交之前变不了。分块数在拿锁之前数好（持锁时数会挡住检索）：
            # 这之间插进来的还是按建图的值插的，少数几块只让下一次重建来得稍早
            cursor.execute("SELECT relfilenode FROM pg_class WHERE relname = %s", [name])
            mark = _GRAPH_MARK.format(ef=KB_INDEX_EF_CONSTRUCTION, node=int(cursor.fetchone()[0]), chunks=int(chunks))
            cursor.execute(f"COMMENT ON INDEX {name} IS '{mark}'")
    except OperationalError as exc:
        if not isinstance(exc.__cause__, errors.LockNotAvailable):
            raise
        logger.info("ann_kb_index_insert_ef_deferred", knowledge_base_id=str(kb_id))
        return False
    logger.info("ann_kb_index_insert_ef_set", knowledge_base_id=str(kb_id), ef_construction=target)
    return True


def _kb_chunks(kb_id: uuid.UUID) -> int:
    """知识库的分块数，与 :func:`kb_indexes_sync` 同一个口径（completed 文档的 ``chunk_count`` 之和）。"""
    return _chunk_counts(kb_id).get(kb_id, 0)


def _chunk_counts(kb_id: uuid.UUID | None = None) -> dict[uuid.UUID, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT knowledge_base_id, coalesce(sum(chunk_count), 0) FROM documents"
                       " WHERE status = %s AND (%s::uuid IS NULL OR knowledge_base_id = %s)"
                       " GROUP BY knowledge_base_id", [Document.Status.COMPLETED, kb_id, kb_id])
        return {kb: int(n) for kb, n in cursor.fetchall()}


def kb_index_from_row(kb_id: uuid.UUID, row: Sequence[Any] | None) -> KbIndex | None:
    """``INDEX_STATE_SQL`` 的一行（没有索引时为 None 或全是 NULL）转成 :class:`KbIndex`。"""
    if row is None or row[1] is None:
        return None
    center = _CENTER.search(row[2])
    return KbIndex(kb_index_name(kb_id), _OPCLASS_COMPRESSION.get(row[1], ""), bool(row[0]),
                   f"'{center.group(1)}'" if center else "", graph_excludes_pending(row[2]))


def _center_literal(kb: KnowledgeBase) -> str:
    """知识库全部向量的均值，写成 SQL 字面量（只含数字、逗号与方括号，由正则把关）。"""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT avg(embedding::vector({int(kb.embedding_dimension)}))::text FROM document_chunks"
                       f" WHERE {_kb_predicate(kb)}")
        value = cursor.fetchone()[0]
    literal = f"'{value}'::vector"
    if value is None or not _CENTER.fullmatch(literal):
        raise ValueError(f"knowledge base {kb.id} has no vectors to centre")
    return f"'{value}'"


def kb_index_sql(kb: KnowledgeBase, *, concurrently: bool = True, name: str = "") -> str:
    """建知识库自己的部分 HNSW 索引的 SQL（``name`` 默认是 :func:`kb_index_name`）；谓词与 :func:`ann_search` 的
    查询条件字面一致，规划器才会选它。还没进图的分块（``DocumentChunk.ann_pending``）不在图里，由
    :func:`flush_pending` 插进来。"""
    compression = KnowledgeBase.VectorCompression(kb.vector_compression)
    expression, opclass, _ = _COMPRESSION_SQL[compression]
    dim = int(kb.embedding_dimension)
    center = _center_literal(kb) if compression == KnowledgeBase.VectorCompression.BINARY else ""
    return (
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS {name or kb_index_name(kb.id)}"
        f" ON document_chunks USING hnsw ({expression.format(dim=dim, center=center)} {opclass})"
        f" WITH (m = {HNSW_M}, ef_construction = {KB_INDEX_EF_CONSTRUCTION})"
        f" WHERE {_graph_predicate(kb)}"
    )


def _kb_predicate(kb: KnowledgeBase, alias: str = "") -> str:
    # uuid 与维度都不是用户输入的字符串（uuid 对象的规范写法、白名单整数），可以安全地写成字面量
    return (f"{alias}knowledge_base_id = '{uuid.UUID(str(kb.id))}'::uuid"
            f" AND {alias}embedding_dim = {int(kb.embedding_dimension)}")


def _graph_predicate(kb: KnowledgeBase, alias: str = "") -> str:
    # 图的部分条件：知识库的分块里已经进图的（documents.models.GRAPH_PENDING_CLAUSE 这一项，定义里有它才算新式的图）
    return f"{_kb_predicate(kb, alias)} AND NOT {alias}ann_pending"


def kb_index_build(*, kb: KnowledgeBase, chunks: int | None = None) -> bool:
    """为知识库建自己的索引（CONCURRENTLY，不阻塞写入）；已经有可用的同压缩索引时什么也不做，返回是否建了。

    必须在事务之外调用（CONCURRENTLY 的要求）。两个 worker 同时处理同一知识库时只有拿到 advisory lock 的那个建；
    先拿锁再看索引状态：持锁的会话还在建的索引同样是“无效”的，不拿锁就看会把它当成失败的残留删掉。
    上次失败留下的无效索引（建它的会话已不在、锁已释放）先删掉。压缩方式改了的：新图以
    :func:`kb_index_rebuild_name` 建在旧图旁边，建好才删旧图、改名——建图期间（百万块要几十分钟）检索照旧走旧图，
    库里不在共享索引里的分块（``documents.models.DocumentChunk.shared_ann``）只有它找得到，先删掉就只能精确扫描。
    图建好之后把插入用的 ``ef_construction`` 调小（:func:`_set_insert_ef`，拿不到锁时每轮同步再试）；知识库从那时起
    长大了一半、或图被别人按调小的值整张重建过（见 :data:`_GRAPH_MARK`）的，同样在旁边按建图的值重建。
    ``chunks`` 是知识库的分块数（定时同步已经数过；不给就数一次）。
    """
    with advisory_lock(kb_index_lock_key(kb.id)) as acquired:
        if not acquired:
            logger.info("ann_kb_index_busy", knowledge_base_id=str(kb.id))
            return False
        state = kb_index_state(kb.id)
        name, rebuild = kb_index_name(kb.id), kb_index_rebuild_name(kb.id)
        chunks = _kb_chunks(kb.id) if chunks is None else chunks
        with connection.cursor() as cursor:
            if state and state.valid and state.compression == kb.vector_compression:
                # documents.0015 之前建的图收全部分块：换成不收还没进图的分块的，写入才能先不插图
                reason = _graph_rebuild_reason(cursor, name, chunks) if state.excludes_pending else "pending_predicate"
                if not reason:
                    _set_insert_ef(cursor, kb.id, name, chunks)
                    return False
                # 下面在旁边按建图的值重建，建好才换下
                logger.info("ann_kb_index_graph_rebuild", knowledge_base_id=str(kb.id), reason=reason)
            # 上次换图中途（建新图时、或删旧图与改名之间）被打断留下的新图，不论是否建好都重来
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {rebuild}")
            if state and not state.valid:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            # 一次建完整张图需要的内存：向量本身加邻居表，按行数估计，超过上限时 pgvector 退化为逐行插入（慢很多）
            cursor.execute("SELECT set_config('maintenance_work_mem', %s, false)",
                           [f"{settings.ANN_BUILD_MEMORY_MB}MB"])
            if state and state.valid:
                cursor.execute(kb_index_sql(kb, name=rebuild))
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                cursor.execute(f"ALTER INDEX {rebuild} RENAME TO {name}")
            else:
                cursor.execute(kb_index_sql(kb))
            cursor.execute("RESET maintenance_work_mem")
            _set_insert_ef(cursor, kb.id, name, chunks)
        logger.info("ann_kb_index_built", knowledge_base_id=str(kb.id), compression=kb.vector_compression)
        return True


def kb_index_drop(*, kb_id: uuid.UUID) -> bool:
    """删掉知识库自己的索引（CONCURRENTLY）；没有、或另一个会话正在建它（持有同一把锁）时返回 False。"""
    with advisory_lock(kb_index_lock_key(kb_id)) as acquired:
        if not acquired:
            # 知识库刚删除或刚缩小而索引还在建：等它建完，下一轮同步再删
            logger.info("ann_kb_index_busy", knowledge_base_id=str(kb_id))
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_class WHERE relname = ANY(%s)",
                           [[kb_index_name(kb_id), kb_index_rebuild_name(kb_id)]])
            if not cursor.fetchone()[0]:
                return False
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {kb_index_rebuild_name(kb_id)}")
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {kb_index_name(kb_id)}")
    logger.info("ann_kb_index_dropped", knowledge_base_id=str(kb_id))
    return True


def kb_indexes_sync() -> dict[str, list[str]]:
    """按当前分块数为每个知识库建或删自己的索引，返回 {"built": [...], "dropped": [...]}（知识库 id）。

    幂等，可被定时任务反复调用：一次调用里串行建，每个索引建完才建下一个。分块数取自 completed 文档的
    ``chunk_count``（与检索选择精确扫描用的是同一个估计）。
    """
    counts = _chunk_counts()
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_class c WHERE c.relkind = 'i' AND c.relname LIKE %s",
                       ["document_chunks\\_ann\\_%"])
        existing = {row[0] for row in cursor.fetchall()}
    built, dropped, keep = [], [], set()
    for kb in KnowledgeBase.objects.exclude(status=KnowledgeBase.Status.DELETED):
        chunks = counts.get(kb.id, 0)
        name = kb_index_name(kb.id)
        if chunks >= settings.ANN_KB_INDEX_MIN_CHUNKS:
            keep.add(name)
            if kb_index_build(kb=kb, chunks=chunks):
                built.append(str(kb.id))
        elif name in existing and chunks >= settings.ANN_KB_INDEX_MIN_CHUNKS // 2:
            keep.add(name)  # 滞回：在阈值附近上下波动的知识库不反复建删
    for name in sorted(existing - keep):
        kb_id = uuid.UUID(name.removeprefix("document_chunks_ann_").removesuffix(_REBUILD_SUFFIX))
        if kb_index_name(kb_id) in keep:
            continue  # 要留的知识库换图中途留下的新图：下一次 kb_index_build 处理它
        if kb_index_drop(kb_id=kb_id):
            dropped.append(str(kb_id))
    return {"built": built, "dropped": dropped}


# 把还没进图的分块插进图里时，一条 UPDATE 改多少行（一个事务）：10 万块的图上每块约 2 ms 的图插入，一批约 1 秒
_FLUSH_BATCH = 500


def flush_pending(*, kb_id: uuid.UUID | None = None) -> int:
    """把还没进图的分块（``DocumentChunk.ann_pending``）插进知识库自己的图，返回插了多少块；``kb_id`` 为空时处理所有
    知识库。幂等，可与写入、别的 flush 同时跑。

    插图就是把这一列改成假：图的部分条件是 ``NOT ann_pending``，这条 UPDATE 产生的新行版本满足它，PostgreSQL 在
    UPDATE 里把它插进图（按图当前的插入 ``ef_construction``）。触发器 v5 看全文输入没变，什么也不做。每批一个事务，
    ``SKIP LOCKED`` 跳过正被别的事务改、删的分块（文档重新索引时整批删掉的分块不必插）；中途被杀，提交了的批已经在图里，
    其余的下次接着做。知识库自己的图这时不存在（缩小后删掉了）也照样改：那时检索精确扫描，改一列不插任何图。
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT knowledge_base_id FROM document_chunks WHERE ann_pending"
                       " AND (%s::uuid IS NULL OR knowledge_base_id = %s)", [kb_id, kb_id])
        kbs = [row[0] for row in cursor.fetchall()]
    total = 0
    for kb in kbs:
        flushed, done = 0, _FLUSH_BATCH
        while done == _FLUSH_BATCH:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("UPDATE document_chunks SET ann_pending = false WHERE id IN (SELECT id"
                               " FROM document_chunks WHERE knowledge_base_id = %s AND ann_pending ORDER BY id"
                               " LIMIT %s FOR UPDATE SKIP LOCKED)", [kb, _FLUSH_BATCH])
                done = cursor.rowcount
            flushed += done
        logger.info("ann_pending_flushed", knowledge_base_id=str(kb), chunks=flushed)
        total += flushed
    return total


def ann_search(kb: KnowledgeBase, *, query: str, scope: str, params: Sequence[Any], limit: int,
               exact: bool, index: KbIndex | None, chunks: int) -> tuple[list[tuple[int, float]], str]:
    """在 ``scope``（``search.retrieval`` 的检索范围 SQL 与参数）里按余弦距离取前 ``limit`` 个 (分块 id, 距离)。

    ``index`` 是知识库自己的索引在执行查询的那个库上的状态（``search.retrieval.search_plan`` 在检索连接上读出：
    副本回放落后时，主库上已建好的索引在副本上可能还不存在或还无效）。
    返回的方法名："exact"、"kb_index"（知识库自己的索引，压缩时带后缀，如 "kb_index:binary"）、"hnsw"（共享索引），
    ANN 凑不满候选退回精确扫描时加 "+exact"。``query`` 是向量字面量，``chunks`` 是知识库的可检索分块数（定 ef_search）。
    """
    dim = int(kb.embedding_dimension)
    conn = search_connection()
    if exact:
        return _run(conn, _exact_sql(dim, scope), [query, *params, limit], None), "exact"
    if index and index.valid:
        compression = KnowledgeBase.VectorCompression(index.compression)
        method = "kb_index" + ("" if compression == KnowledgeBase.VectorCompression.NONE else f":{compression}")
        rows = _run(conn, *kb_index_statement(kb, index, scope, params, query, limit, chunks))
    else:
        method = "hnsw"
        distance = _COMPRESSION_SQL[KnowledgeBase.VectorCompression.NONE][2].format(dim=dim, q="%s")
        # 条件与共享索引的部分条件字面一致（documents.models.hnsw_index），规划器才会选它
        sql = (f"SELECT c.id, {distance} AS distance FROM document_chunks c"
               f" WHERE c.embedding_dim = {dim} AND c.shared_ann AND {scope} ORDER BY distance LIMIT %s")
        rows = _run(conn, sql, [query, *params, limit], max(settings.HNSW_EF_SEARCH, limit))
    if len(rows) < limit:
        # 迭代扫描在 max_scan_tuples 内凑不满（过滤条件太严）：退回精确扫描，候选数永远是 min(limit, 范围内行数)
        return _run(conn, _exact_sql(dim, scope), [query, *params, limit], None), f"{method}+exact"
    return rows, method


def stored_distance(dim: int, alias: str = "c.") -> str:
    """按表里存的向量算余弦距离的 SQL 表达式（查询向量是它前面的 ``%s``）：精确扫描、压缩索引候选的重排与给候选补距离
    共用这一个式子，同一个分块在哪条路上得到的距离都相同。

    列存半精度（见 :mod:`documents.models`），查询向量也取半精度、直接用 halfvec 的 ``<=>``：每行 cast 回 ``vector``
    要转换并分配一次。7 千块的精确扫描（SQL，机器空闲）：cast 回 ``vector`` 4.3 ms，直接算 2.8 ms，改前 float32 的列
    3.0 ms；距离的差别在 1e-6 以下。
    """
    return f"{alias}embedding <=> %s::halfvec({int(dim)})"


def _exact_sql(dim: int, scope: str) -> str:
    # 先用 b-tree 圈出本库的行、在 CTE 里就算好距离（MATERIALIZED 阻止规划器改走 HNSW），外面只对 (id, 距离) 取前 N。
    # 不要把向量本身物化：1 万个 384 维向量 7.7 MB，超过 work_mem 会写临时文件
    return (f"WITH scoped AS MATERIALIZED (SELECT c.id, {stored_distance(dim)} AS distance"
            f" FROM document_chunks c WHERE c.embedding_dim = {dim} AND {scope})"
            f" SELECT id, distance FROM scoped ORDER BY distance, id LIMIT %s")


# pgvector 的 hnsw.ef_search 上限
_EF_SEARCH_MAX = 1000


def ef_search_floor(chunks: int) -> int:
    """知识库自己的图上 ef_search 的下限：10 万块以内是 ``RAG_ANN_EF_SEARCH``，再往上库每大 10 倍多一倍。

    图越大，同样的 ef_search 越容易困在错误的区域里。校准过的合成向量（``bench/ann_oversample.py``）：10 万块时
    ef_search 200 的召回@15 / @50 是 1.000 / 0.999；100 万块时同样的 200 只有 0.953 / 0.951，有的查询一个近邻都
    没找到；400 时 0.989 / 0.992，800 时 0.991 / 0.996 但慢 2.4 倍。
    """
    scale = 1.0 + max(0.0, math.log10(max(chunks, 1) / 100_000))
    return min(round(settings.ANN_EF_SEARCH * scale), _EF_SEARCH_MAX)


def kb_index_statement(kb: KnowledgeBase, index: KbIndex, scope: str, params: Sequence[Any], query: str,
                       limit: int, chunks: int) -> tuple[str, list[Any], int]:
    """走知识库自己的索引 ``index`` 取前 ``limit`` 个的 SQL、参数与 ef_search（基准用它对同一条语句 EXPLAIN）。

    图不收还没进图的分块（``index.excludes_pending``）时，另对它们精确扫描（部分索引 ``document_chunks_pending_idx``
    圈出，至多 ``RAG_ANN_PENDING_MAX_CHUNKS`` 块），两边的前 ``limit`` 个按同一个距离式合并：刚写进来的分块与图里的
    分块一样找得到。
    """
    compression = KnowledgeBase.VectorCompression(index.compression)
    dim = int(kb.embedding_dimension)
    distance = _COMPRESSION_SQL[compression][2].format(dim=dim, q="%s", center=index.center)
    graph = _graph_predicate(kb, "c.") if index.excludes_pending else _kb_predicate(kb, "c.")
    where = f"{graph} AND {scope}"
    if compression != KnowledgeBase.VectorCompression.BINARY:
        # 列本身存半精度：halfvec 索引的距离与堆里存的向量的距离（stored_distance）是同一个值，多取候选再重排只是
        # 多读一倍的堆元组、把距离再算一遍（以前列存 float32，才要重排）。外层按 (距离, id) 排，距离相同的分块
        # （同样的文本）次序与精确扫描一致
        pending_distance = distance
        sql = (f"SELECT id, distance FROM (SELECT c.id, {distance} AS distance FROM document_chunks c"
               f" WHERE {where} ORDER BY distance LIMIT %s) hits ORDER BY distance, id")
        args = [query, *params, limit]
        # 图上要看的候选数：与改前（多取 2 倍再重排）同一个 ef_search，召回不变。深度 100 时只按 2 倍给
        # （ef_search 200）召回@100 从 0.46 掉到 0.31（10 万块的合成库，相对精确扫描）
        candidates = 2 * limit
    else:
        # 汉明距离只用来取候选：多取 RAG_ANN_BINARY_OVERSAMPLE 倍，再按堆里存的向量精确重排，返回的距离与精确扫描
        # 同一个式子
        pending_distance = stored_distance(dim)
        candidates = limit * settings.ANN_BINARY_OVERSAMPLE
        sql = (f"WITH candidates AS MATERIALIZED (SELECT c.id, c.embedding FROM document_chunks c WHERE {where}"
               f" ORDER BY {distance} LIMIT %s)"
               f" SELECT id, {stored_distance(dim, '')} AS distance FROM candidates"
               f" ORDER BY distance, id LIMIT %s")
        args = [*params, query, candidates, query, limit]
    if index.excludes_pending:
        pending = (f"SELECT c.id, {pending_distance} AS distance FROM document_chunks c"
                   f" WHERE {_kb_predicate(kb, 'c.')} AND c.ann_pending AND {scope} ORDER BY distance, c.id LIMIT %s")
        sql = f"SELECT id, distance FROM (({sql}) UNION ALL ({pending})) u ORDER BY distance, id LIMIT %s"
        args += [query, *params, limit, limit]
    # ef_search 至少是要的候选数的两倍：100k 分块上候选 100、ef_search 100 时召回只有 0.95。
    # RAG_ANN_EF_SEARCH 默认 200：同样的数据重建一次图，候选 15、ef_search 100 的召回在 0.93~1.0 之间摆动
    return sql, args, max(ef_search_floor(chunks), 2 * candidates)


def hnsw_settings_statement(ef_search: int) -> tuple[str, list[str]]:
    """HNSW 查询之前、同一事务里的本地设置（``set_config(…, is_local)``）。

    关掉排序：走到这里的都是调用方按分块数判定为大的知识库，该走 HNSW。规划器的行数估计却会漂：5 万分块的知识库在
    反复上传、删除文档之后，文档半连接把本库的行数估成 156 行，于是选了“逐个文档回表 + 排序”（每个查询 228 ms，
    20 RPS 的负载下检索吞吐跌到一半）。关掉排序后索引给出顺序的计划总是胜出（外层重排候选的那次排序两种计划
    都有）；过滤太严时迭代扫描凑不满，照旧退回精确扫描。
    """
    return ("SELECT set_config('hnsw.ef_search', %s, true),"
            " set_config('hnsw.iterative_scan', 'strict_order', true),"
            " set_config('hnsw.max_scan_tuples', %s, true),"
            " set_config('enable_sort', 'off', true)",
            [str(min(ef_search, _EF_SEARCH_MAX)), str(settings.HNSW_MAX_SCAN_TUPLES)])


def _run(conn: BaseDatabaseWrapper, sql: str, args: Sequence[Any], ef_search: int | None,
         ) -> list[tuple[int, float]]:
    """在 ``conn``（``search_connection()``：有只读副本时是副本）上执行一条向量查询；走 HNSW 时先在同一个事务里
    set_config(…, is_local) 设好 ef_search 与迭代扫描（不影响连接上的其他查询）。

    两条语句经 psycopg 的管道一次发出：自动提交下，管道里直到 Sync 的语句是一个隐式事务（PostgreSQL 扩展查询协议），
    本地设置随管道结束时的 Sync 失效。以前 BEGIN、SET、查询、COMMIT 是四次往返，每个检索请求都有；现在一次。
    精确扫描只有一条语句，直接执行。
    """
    with conn.cursor() as cursor:
        if ef_search is None:
            cursor.execute(sql, list(args))
        else:
            # 管道结束（Sync）时才报出的错误不经过 Django 的游标包装：wrap_database_errors 把它转成 Django 的异常
            # 并标记连接出过错，请求结束时照常检查连接是否可用
            with conn.wrap_database_errors, conn.connection.pipeline():
                cursor.execute(*hnsw_settings_statement(ef_search))
                cursor.execute(sql, list(args))
        return [(int(chunk_id), float(distance)) for chunk_id, distance in cursor.fetchall()]
