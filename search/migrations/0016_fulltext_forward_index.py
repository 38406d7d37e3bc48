"""全文存储 v8 / v9 与触发器 v6：分块的词位不再存在 ``document_chunks.search_vector`` 里，改存序号表的正排。

1. 存储 v8：``fulltext_docs`` 与 ``fulltext_deleted`` 加 ``terms``（正排，格式见 :mod:`raglib.forward`）。
2. 回填：已合并的分块从它的 ``search_vector`` 算出正排（``fulltext_chunk_terms`` 取词位与词频，Python 里编码，
   ``_frozen_forward`` 是编码的冻结副本）；删除集的行从它的词位数组（只有词位，词频记成正文 1 次：删除集只用来
   修正 df 与 N）。序号表的行找不到分块时（引擎本来就不一致）写一个空正排，``manage.py rebuild_fulltext --verify``
   会报出来。按 (知识库, 序号) 分批，每批 2,000 行。
3. 存储 v9：``terms`` 非空，删除集去掉词位数组与它的 GIN。
4. 触发器 v6：``search_vector`` 成了过渡列，BEFORE ROW 触发器写 L0 之后置 NULL（见那个文件的说明）。
5. 把已有分块的 ``search_vector`` 置 NULL：这一条 UPDATE 重写整张 ``document_chunks``（与 ``documents.0013`` 一样，
   大库在维护窗口里做，之后 ``VACUUM FULL document_chunks`` 把空出来的页还给文件系统，见 docs/DEPLOYMENT.md）；
   触发器 v6 的 WHEN 条件让它不进全文引擎。

整个迁移在一个事务里，中途失败什么也不留下，重跑从头来。不能回退：位置信息已经丢了；要回到旧代码，先回退
代码与迁移记录，再用旧代码的 ``rebuild_fulltext``（它会重新切词、写回 tsvector）。
"""

from django.db import migrations

from ._frozen_forward import forward
from ._frozen_sql import frozen_sql

STORAGE_V8_SQL = frozen_sql("fulltext_storage.v8.sql", "9dfe02875f3c9a4b5e14da6663be8af8a53bbcefa572daa502ded58061c2681c")
STORAGE_V9_SQL = frozen_sql("fulltext_storage.v9.sql", "12f6af9ce5377559dcb5ba801e7dc63abe739f14a83f56605f28c14c882c3afd")
MAINTAIN_SQL = frozen_sql("fulltext_stats_maintain.v6.sql", "295270668ceb6b5ef2a2809e20175c08be4bfa8386d8e4f4b318ae8b907c4865")

_BATCH = 2000


def backfill(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        last = ("00000000-0000-0000-0000-000000000000", -1)
        while True:
            cursor.execute(
                "SELECT d.knowledge_base_id, d.ordinal, t.lexemes, t.title_tf, t.body_tf FROM fulltext_docs d"
                " LEFT JOIN document_chunks c ON c.id = d.chunk_id"
                " CROSS JOIN LATERAL fulltext_chunk_terms(c.search_vector::tsvector) t"
                " WHERE (d.knowledge_base_id, d.ordinal) > (%s::uuid, %s) ORDER BY 1, 2 LIMIT %s",
                [*last, _BATCH])
            rows = cursor.fetchall()
            if not rows:
                break
            cursor.execute(
                "UPDATE fulltext_docs d SET terms = v.terms FROM unnest(%s::uuid[], %s::int[], %s::bytea[])"
                " AS v(kb, ordinal, terms) WHERE d.knowledge_base_id = v.kb AND d.ordinal = v.ordinal",
                [[row[0] for row in rows], [row[1] for row in rows],
                 [forward(list(row[2]), list(row[3]), list(row[4])) for row in rows]])
            last = (rows[-1][0], rows[-1][1])
        cursor.execute("SELECT knowledge_base_id, ordinal, lexemes FROM fulltext_deleted")
        rows = cursor.fetchall()
        if rows:
            cursor.execute(
                "UPDATE fulltext_deleted d SET terms = v.terms FROM unnest(%s::uuid[], %s::int[], %s::bytea[])"
                " AS v(kb, ordinal, terms) WHERE d.knowledge_base_id = v.kb AND d.ordinal = v.ordinal",
                [[row[0] for row in rows], [row[1] for row in rows],
                 [forward(list(row[2]), [0] * len(row[2]), [1] * len(row[2])) for row in rows]])


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0015_fulltext_segment_norms'),
        ('documents', '0015_chunk_ann_pending'),
    ]

    operations = [
        migrations.RunSQL(STORAGE_V8_SQL),
        migrations.RunPython(backfill),
        migrations.RunSQL(STORAGE_V9_SQL),
        migrations.RunSQL(MAINTAIN_SQL),
        migrations.RunSQL("UPDATE document_chunks SET search_vector = NULL WHERE search_vector IS NOT NULL"),
    ]
