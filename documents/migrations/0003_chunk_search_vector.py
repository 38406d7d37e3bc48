"""分块的全文索引列：加 tsvector 列，回填已有分块，再建 GIN 索引（先填数据再建索引，比逐行维护索引快）。

回填用 ``_frozen_analysis_0004`` 里冻结的切词代码，不导入应用代码（见那个模块的说明）。
"""

import django.contrib.postgres.indexes
import django.contrib.postgres.search
from django.conf import settings
from django.db import migrations

from ._frozen_analysis_0004 import chunk_terms

BATCH_SIZE = 500


def backfill_search_vectors(apps, schema_editor, batch_size=BATCH_SIZE):
    """为 search_vector 为空的分块按 id 分批计算 tsvector；只处理空值，可重复执行。返回更新的行数。"""
    Chunk = apps.get_model("documents", "DocumentChunk")
    alias = schema_editor.connection.alias
    table = schema_editor.connection.ops.quote_name(Chunk._meta.db_table)
    last_id, updated = 0, 0
    while True:
        rows = list(
            Chunk.objects.using(alias)
            .filter(search_vector__isnull=True, id__gt=last_id)
            .order_by("id")
            .values_list("id", "chunk_text", "metadata")[:batch_size]
        )
        if not rows:
            return updated
        ids, vectors = [], []
        for chunk_id, text, metadata in rows:
            ids.append(chunk_id)
            vectors.append(chunk_terms(text, metadata, settings.FULLTEXT_ANALYZER)[0])
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS c SET search_vector = v.sv::tsvector "  # noqa: S608 - 表名来自模型元数据
                "FROM unnest(%s::bigint[], %s::text[]) AS v(id, sv) WHERE c.id = v.id",
                [ids, vectors],
            )
        updated += len(rows)
        last_id = ids[-1]


class Migration(migrations.Migration):

    dependencies = [
        ('documents', '0002_ingestion_fields'),
        ('knowledge', '0003_ingestion_fields'),
    ]

    operations = [
        migrations.AddField(
            model_name='documentchunk',
            name='search_vector',
            field=django.contrib.postgres.search.SearchVectorField(blank=True, null=True, verbose_name='全文索引'),
        ),
        migrations.RunPython(backfill_search_vectors, migrations.RunPython.noop, elidable=True),
        migrations.AddIndex(
            model_name='documentchunk',
            index=django.contrib.postgres.indexes.GinIndex(fields=['search_vector'], name='document_chunks_fts_gin'),
        ),
    ]
