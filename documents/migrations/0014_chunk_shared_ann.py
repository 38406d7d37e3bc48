"""分块多一列 ``shared_ann``：知识库有了自己的 HNSW 索引之后写进来的分块不再进按维度的共享索引。

10 万块的知识库有了自己的索引（search.ann，越过 ``RAG_ANN_KB_INDEX_MIN_CHUNKS`` 后由定时任务建）之后，每个新分块要
插两张 HNSW 图，写入只有没有它时的三分之一（bench/README.md）。共享索引只在知识库自己的索引缺失时才被用到，
于是让这样的分块只进自己那张图：共享索引加部分条件 ``shared_ann``，写入时由 ``documents.ingestion.copy_chunks``
决定这一列；知识库有 ``shared_ann`` 为假的分块而自己的索引不可用时，检索改走精确扫描（search.retrieval）。

已有的行都是真（``DEFAULT true``，PostgreSQL 11 起加列不重写表）。共享索引要按新条件重建：每个维度先
``CREATE INDEX CONCURRENTLY`` 建一个临时名字的新索引，再 ``DROP INDEX CONCURRENTLY`` 旧的、改名——都不阻塞读写，
大库上要跑一阵（100 万块约十几分钟，docs/DEPLOYMENT.md）。迁移不在事务里：中途被杀，重跑从断处接着做
（新索引已建好而旧的已删时只改名；建到一半的无效临时索引删掉重建）。
"""

from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

import django.contrib.postgres.indexes
import django.db.models.functions.comparison
import pgvector.django.indexes
import pgvector.django.vector

DIMENSIONS = (384, 768, 1024)


def _shared_index(dim, condition):
    return pgvector.django.indexes.HnswIndex(
        django.contrib.postgres.indexes.OpClass(
            django.db.models.functions.comparison.Cast('embedding', pgvector.django.vector.VectorField(dimensions=dim)),
            name='vector_cosine_ops'),
        condition=condition, ef_construction=64, m=16, name=f'document_chunks_hnsw_{dim}')


def _rebuild(schema_editor, predicate):
    """把每个维度的共享索引换成部分条件为 ``predicate`` 的新索引（已经是的跳过）。"""
    shared = "shared_ann" in predicate
    with schema_editor.connection.cursor() as cursor:
        # 一次建完整张图需要的内存，与知识库自己的索引同一个设置（search.ann.kb_index_build）
        cursor.execute("SELECT set_config('maintenance_work_mem', %s, false)", [f"{settings.ANN_BUILD_MEMORY_MB}MB"])
        for dim in DIMENSIONS:
            name, temporary = f"document_chunks_hnsw_{dim}", f"document_chunks_hnsw_{dim}_rebuild"
            cursor.execute("SELECT c.relname, pg_get_indexdef(c.oid), i.indisvalid FROM pg_class c"
                           " JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relname = ANY(%s)", [[name, temporary]])
            found = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
            definition, valid = found.get(name, ("", False))
            if valid and ("shared_ann" in definition) == shared:
                continue
            ready, ready_valid = found.get(temporary, ("", False))
            if definition or not (ready_valid and ("shared_ann" in ready) == shared):
                # 除非上次已按同一条件建好临时索引、删掉了旧的（只差改名），都从头建：建到一半的无效临时索引先删掉
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {temporary}")
                cursor.execute(f"CREATE INDEX CONCURRENTLY {temporary} ON document_chunks USING hnsw"
                               f" ((embedding::vector({dim})) vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
                               f" WHERE {predicate.format(dim=dim)}")
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            cursor.execute(f"ALTER INDEX {temporary} RENAME TO {name}")
        cursor.execute("RESET maintenance_work_mem")


def forwards(apps, schema_editor):
    _rebuild(schema_editor, "embedding_dim = {dim} AND shared_ann")


def backwards(apps, schema_editor):
    _rebuild(schema_editor, "embedding_dim = {dim}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('documents', '0013_chunk_terms_as_text'),
        ('knowledge', '0006_cleanup_jobs'),
    ]

    operations = [
        migrations.AddField(
            model_name='documentchunk',
            name='shared_ann',
            field=models.BooleanField(db_default=True, editable=False, verbose_name='进共享向量索引'),
        ),
        AddIndexConcurrently(
            model_name='documentchunk',
            index=models.Index(condition=models.Q(('shared_ann', False)), fields=['knowledge_base'],
                               name='document_chunks_detached_idx'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                *[migrations.RemoveIndex(model_name='documentchunk', name=f'document_chunks_hnsw_{dim}')
                  for dim in DIMENSIONS],
                *[migrations.AddIndex(model_name='documentchunk',
                                      index=_shared_index(dim, models.Q(('embedding_dim', dim), ('shared_ann', True))))
                  for dim in DIMENSIONS],
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
