"""全文检索引擎的接口：:class:`FulltextEngine` 与全文一路的结果类型。

检索经 :func:`search.retrieval.fulltext_engine` 取得引擎：全文一路（``fulltext_search``）、给名单外的候选补分数
（``fulltext_scores``）、``manage.py rebuild_fulltext`` / ``compact_fulltext`` 与 L0 的合并任务都经过它。现在只有一个
实现 :class:`search.bm25.PostgresFulltextEngine`：PostgreSQL 里自建的 BM25，仿 Lucene 的压缩块倒排
（``RAG_FULLTEXT_RANKING=ts_rank_cd`` 时用 PostgreSQL 自带的 ``ts_rank_cd`` 排序）。

## 存储与排序（v2）

- **写入只追加**：写入分块的语句带上 tsvector 文本（``search_vector``，过渡列），``document_chunks`` 上的 BEFORE ROW
  触发器给每个新分块在 ``fulltext_l0`` 里追加一行（词位数组与标题、正文词频），再把这一列置 NULL 存下去——分块行里
  不留 tsvector（以前它每块 2.1 KB，是全文数据里最大的一项）。删掉的分块若还在 L0 就删那一行，已合并的连正排记进
  ``fulltext_deleted``。写入不更新任何共享的行，同一知识库的并发写入互不等待；一个分块一行（外加 GIN 的一次插入），
  而不是 v1 的两百多次随机 B 树插入。
- **合并成段**（:mod:`search.segments`，后台任务）：L0 的一批分块按顺序得到稠密的 int4 序号，编成一个不可变的段——
  按词位排序的词典块（约 64 个词一行，罕见词的倒排内联，zlib 压缩后存，:mod:`raglib.lexicon`）与常见词的倒排块
  （≤128 条一行，序号差分编码，词频压成一个字节，块号 0 是影响力最高的一段，:mod:`raglib.postings`）；分块长度
  量化成一个字节，由段按序号存一份（``fulltext_segments.norms``），不在每条倒排里重复。每个分块的正排（词位与
  标题 / 正文词频，不带位置，zlib，:mod:`raglib.forward`，约 0.8 KB）随序号表的行写一次：补分数、删除集修正 df、
  核对都读它。相邻的同层段并成大段，并段时清掉删除集里的分块。
- **统计不单独维护**：N、平均长度、df 都是“段里的 + L0 的 - 删除集的”，在查询的同一个 REPEATABLE READ 快照里读出，
  永远与分块一致（docs/INVARIANTS.md 的 BM25-STATS-EXACT）。
- **打分在服务里**（:mod:`search.bm25`）：取查询词的词典条目与额度内的倒排块，numpy 解码、打分、去掉删除集，前若干名
  换成分块 id 再回表检查范围（没有过滤条件的普通查询只查序号表与 L0 里记着的文档，不读分块行）。
  短语、布尔、exact 查询另外要求分块满足 tsquery：回表之后按分数顺序检查、够 limit 就停。没有短语算符的只看词在不在，
  用引擎登记的词项（正排或 L0 的行）拼成不带位置的 tsvector 在 PostgreSQL 里 ``@@``；短语要位置，对候选的原文重新切词
  （:mod:`search.chunk_terms`；每块 0.2~0.6 ms，这类查询少见，候选又已按必需词筛过）。
  查询里孤立的单字是前缀词：它的 df 取自段写出时按首字汇总的 ``fulltext_prefixes``，只有额度里要读它的倒排时
  才取以它开头的词典块（常用字开头的词位有上千个）。
  段不变，所以段的词典、按首字的 df 与常见词的前几个倒排块都缓存在检索进程里（:mod:`search.segment_cache`）；
  合并完的库（L0 与删除集都空）上，热缓存的普通查询只发回表那一条语句，它顺带核对统计与段表没变
  （docs/INVARIANTS.md 的 SETTLED-STATE-CHECKED）。

## 引擎的 SQL 在哪里

引擎在数据库里的部分——表、函数、触发器——写在 ``search/sql/`` 里，一个关注点一个文件，注释写明为什么：

====================================  ==========================================================================
``fulltext_storage.vN.sql``           全文表的定义：v2 建 L0、序号表、删除集、段、词典块与倒排块（统计行
                                      ``fulltext_kb_stats`` 是 Django 模型，见 ``search.models``）；v1 的倒排表
                                      由 v2 删掉；v3 加每个段按首字汇总的 df（前缀词的 df 不必读遍词典块）；
                                      v4 给 L0 与序号表加上分块所属的文档（回表检查不读分块行）；
                                      v5 给每个段一个全局唯一的代号（检索进程按它缓存词典块）；
                                      v6 记下段的写出时间；v7 给段按序号存分块的长度字节；v8 给序号表与
                                      删除集加正排，v9（回填之后）让它非空、删掉删除集的词位数组
``fulltext_chunk_terms.vN.sql``       ``fulltext_chunk_terms()``：tsvector → 词位与标题/正文词频数组
                                      （写 L0、回填、重建共用）
``fulltext_stats_maintain.vN.sql``    ``document_chunks`` 上的触发器与它们的函数（写 L0、记删除集）；v6 起写入是
                                      BEFORE ROW（登记之后把过渡列 ``search_vector`` 置 NULL），删除仍是语句级
``fulltext_kb_stats_dropped.vN.sql``  统计行被删时清掉该库全部全文数据的触发器与函数（整库清理的快路）
``fulltext_stats_apply.vN.sql``       v1 的增量函数；v2 退役（文件只有 DROP）
``fulltext_impact.vN.sql``            v1 的影响力函数；v2 退役（影响力改由 ``raglib.postings.impacts`` 在合并时算）
====================================  ==========================================================================

文件一经发布就不再修改，“当前版本”与“迁移做的事”因此永远一致：

- 迁移用 ``search/migrations/_frozen_sql.py`` 的 ``frozen_sql(文件名, sha256)`` 读文件，内容与迁移里记下的
  SHA-256 不符就拒绝加载。迁移不导入应用代码，也不拼接、修补别的迁移里的 SQL。
- 改函数或触发器：新建 ``<名字>.v{N+1}.sql``（完整的 ``CREATE OR REPLACE``；退役就只写 ``DROP``），加一个迁移应用它。
  同一名字编号最大的文件就是数据库里当前生效的定义。
- 改表：新建 ``fulltext_storage.v{N+1}.sql``，只写变更，同样由新迁移应用；存储按编号顺序叠加。
- ``tests/search/test_engine_sql.py`` 检查每个文件都被迁移按校验和钉住，并把数据库里活的函数、触发器与表
  和这些文件逐一比较，漂移会被测出来。
- 旧版本的文件在所有部署都迁移过之后随下一次压缩迁移（squash）一起删掉；v1 就是这样来的：
  ``search.0001_squashed_0005_fulltext_engine`` 取代了原来的 0001~0005。v2 由 ``search.0008_fulltext_segments`` 应用，
  v3（按首字的 df）由 ``search.0009_fulltext_prefixes`` 应用，存储 v4 与触发器函数 v3（记下文档）由
  ``search.0010_fulltext_document_ids`` 应用，存储 v5（段的代号）由 ``search.0011_fulltext_segment_generation`` 应用，
  存储 v6（段的写出时间）由 ``search.0012`` 应用，触发器函数 v4（读分块的词位时转成 tsvector）由
  ``search.0013_fulltext_terms_as_text`` 应用，存储 v7（段按序号存长度字节）由 ``search.0015`` 应用，存储 v8 / v9
  与触发器函数 v6（分块行不再存 tsvector，正排进序号表）由 ``search.0016_fulltext_forward_index`` 应用。

查询一侧的 SQL（读快照、取倒排块、回表检查范围、``ts_rank_cd``、补分数）是 Python 常量，在 :mod:`search.bm25`；
两路共用的检索范围在 :mod:`search.retrieval`，以 :class:`ChunkScope` 交给引擎。

## 换一种引擎

能装 PostgreSQL 全文扩展的部署可以换掉自建的倒排。只写文档、还没有实现：

1. 新写一个模块（如 ``search/pg_search.py``）实现 :class:`FulltextEngine`，让 ``search.retrieval.fulltext_engine``
   按一个运维设置（如 ``RAG_FULLTEXT_ENGINE``）返回它；扩展与索引由一个新迁移按 ``search/sql/<扩展>_index.v1.sql``
   创建（``CREATE EXTENSION`` 要超级用户，通常由 DBA 预先装好，迁移只检查并建索引）。
2. **ParadeDB pg_search**：``CREATE INDEX ... ON document_chunks USING bm25 (id, (chunk_text::pdb.jieba))
   WITH (key_field='id')``，按 ``chunk_text @@@ ...`` 匹配、``paradedb.score(id)`` 排序。分词在扩展里
   （jieba / chinese_compatible / lindera），与 :mod:`raglib.analysis` 的字 bigram 不同，排序会变：
   换引擎前要用 ``manage.py evaluate`` 在评测集上比较。标题加权要把标题放进单独的索引字段并加权查询。
3. **pg_textsearch**（TigerData）：``CREATE INDEX ... USING bm25 (列) WITH (text_config='...')``，
   ``ORDER BY 列 <@> to_bm25query(...)``（分数取负）。它按 PostgreSQL 的文本检索配置切词，中文要有
   zhparser、pg_jieba 之类的配置，或者索引一个由 :mod:`raglib.analysis` 预先切好、空格分隔的文本列
   （配 ``simple`` 配置）。要求 PostgreSQL 17+ 且放进 ``shared_preload_libraries``；它与 pg_search 都注册了
   名为 ``bm25`` 的访问方法，两者不能装在同一个库里。
4. 各方法在这些扩展上的对应：``search`` 是一条带检索范围的查询（范围 SQL 原样拼进 WHERE）；``index``、``rebuild``
   是 ``REINDEX``（索引由 PostgreSQL 随写入维护，摄取不用改）；``compact`` 什么也不做（扩展自己合并段），
   ``delete`` 也什么都不做（删分块就删了索引项）；
   ``verify`` 返回空列表；``statistics`` 与 ``scores`` 需要 N 与 df：融合的覆盖率闸门
   （:func:`raglib.bm25.coverage`）和对外分数的刻度都靠它们：可以保留自建引擎的 L0 与段只用来读 N 与 df
   （查询时不读倒排块），或者返回 ``statistics=None``（这时混合检索不给名单外的候选补全文分数，覆盖率按 1 处理）。
5. 不再用自建倒排时，新迁移删掉 ``document_chunks`` 上的三个触发器与全文表，摄取省下写 L0 的开销；
   想换回来就再应用一遍当前版本的文件并对每个知识库 ``rebuild``。
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from raglib.analysis import ParsedQuery, QueryTerm


@dataclass(frozen=True)
class PathHit:
    """某一路召回的一个分块：余弦距离（向量），或全文的 BM25 分数（``ts_rank_cd`` 排序时是归一到 0~1 的 rank）。"""

    chunk_id: int
    value: float


@dataclass(frozen=True)
class ChunkScope:
    """检索范围：对 ``document_chunks c`` 的 SQL 条件（不以 AND 开头）与它的参数。

    由 :mod:`search.retrieval` 按知识库、文档状态与调用方的过滤条件生成，两路召回共用；引擎原样拼进自己的查询。
    ``documents`` 只在调用方没有给分块级的过滤条件时才有：这时范围正好是“这些文档里的可检索分块”，它是对
    ``documents d`` 的条件与参数。引擎记着每个分块所属的文档，可以按主键查文档表，不读分块行。
    """

    sql: str
    params: list[Any] = field(default_factory=list)
    documents: tuple[str, list[Any]] | None = None


@dataclass(frozen=True)
class Bm25Statistics:
    """一个查询用到的知识库统计：分块数、平均词数、各查询词的 df（键为 (词位, 是否前缀)）。"""

    n: int
    avgdl: float
    dfs: dict[tuple[str, bool], int]


@dataclass(frozen=True)
class FulltextHits:
    """全文一路的结果：命中，以及查询的 IDF 质量在本库中出现的比例（``raglib.bm25.coverage``，融合用来调权重）。"""

    hits: list[PathHit]
    coverage: float
    # 这个查询在本库里可能得到的最高分（BM25：Σ qtf·idf·(k1+1)，库里没有的词按最大 IDF 计入）；
    # 命中的分数除以它就是 0~1 的“匹配程度”，跨查询可比，用来校准对外分数。ts_rank_cd 本身已在 0~1，为 1
    scale: float = 1.0
    # BM25 排序时这次查询读到的统计（给名单外的候选补分数用，见 FulltextEngine.scores）；ts_rank_cd 排序时为 None
    statistics: Bm25Statistics | None = None


class FulltextEngine(Protocol):
    """全文检索引擎：检索、补分数、统计，以及索引的维护（重算、整库删除、重建、核对）。

    分块的写入不经过引擎：摄取（``documents.ingestion``，在 search 之下的一层）写分块行时就带上全文列
    （``search_vector``、``search_length``），PostgreSQL 实现的倒排与统计由表上的触发器在同一事务里跟上。
    """

    def search(self, kb_id: uuid.UUID, query: ParsedQuery, scope: ChunkScope, limit: int) -> FulltextHits:
        """范围内与查询匹配的分块，按相关性降序的前 ``limit`` 个。"""
        ...

    def scores(self, kb_id: uuid.UUID, query: ParsedQuery, chunk_ids: Sequence[int],
               statistics: Bm25Statistics) -> dict[int, float]:
        """知识库里指定分块在这个查询上的完整分数（与 ``search`` 同一个公式、同一份统计），不含任何查询词的分块为 0。"""
        ...

    def matching(self, kb_id: uuid.UUID, chunk_ids: Sequence[int], tsquery: str) -> set[int]:
        """知识库里这些分块中满足 tsquery（可含短语、``!`` 排除）的；向量一路的 ``-词`` 排除用它。"""
        ...

    def statistics(self, kb_id: uuid.UUID, terms: Sequence[QueryTerm]) -> Bm25Statistics:
        """知识库的分块数、平均词数与各查询词的 df。"""
        ...

    def index(self, *, kb_id: uuid.UUID | None = None) -> int:
        """按当前的切词设置重算分块的全文索引（全部知识库，或 ``kb_id`` 一个）；返回处理的分块数。"""
        ...

    def compact(self, kb_id: uuid.UUID) -> int:
        """把这个知识库新写入、还没整理的索引整理好（PostgreSQL 实现：L0 合并成段、并段、清除删除）；
        返回整理的分块数。由后台任务在写入之后调用，检索不依赖它（没整理的照样查得到，只是慢一些）。"""
        ...

    def delete(self, kb_id: uuid.UUID) -> int:
        """整库清理前先丢掉这个知识库的索引，之后逐批删分块不再逐个维护；返回删掉的索引单位数（段数）。"""
        ...

    def rebuild(self, kb_id: uuid.UUID) -> None:
        """按分块重建这个知识库的索引与统计（修复用）。"""
        ...

    def verify(self, kb_id: uuid.UUID) -> list[str]:
        """存储的索引与按分块重算的差异（人能读的描述）；空列表表示完全一致。"""
        ...
