"""全文存储 v3：每个段按首字汇总的 df（``fulltext_prefixes``），查询里的前缀词（孤立的单字）不必为一个 df 读遍词典块。

存储与整库删除的触发器函数读自 ``search/sql/`` 里的文件（``frozen_sql`` 按这里记下的 SHA-256 读）。已有的段
由这里回填：逐段读词典块（``_frozen_dictionary``，当时格式的冻结副本），按首字求和写入。100k 分块的库约几秒。
回退删掉这张表，查询退回 v2 的做法前要先回退代码。
"""

from django.db import migrations

from ._frozen_dictionary import block_dfs
from ._frozen_sql import frozen_sql

STORAGE_SQL = frozen_sql("fulltext_storage.v3.sql", "77eed27af761acd75e49c94afbcf793b53fb3e5864fc3469a5d2785fafa360c4")
KB_STATS_DROPPED_SQL = frozen_sql("fulltext_kb_stats_dropped.v3.sql", "9cc095b7619716c05e39e147c9a2fa31ee80189fc9f92b23ce90cc8f6db4015c")
KB_STATS_DROPPED_V2_SQL = frozen_sql("fulltext_kb_stats_dropped.v2.sql", "dfd67ef0d4e98471b999d8544d6d4b584b217b880e7e533edfa8f411ddf98d0b")


def backfill(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT knowledge_base_id, segment_id FROM fulltext_segments ORDER BY 1, 2")
        for kb_id, segment_id in cursor.fetchall():
            cursor.execute("SELECT data FROM fulltext_dictionary WHERE knowledge_base_id = %s AND segment_id = %s",
                           [kb_id, segment_id])
            sums: dict[str, int] = {}
            for (data,) in cursor.fetchall():
                for lexeme, df in block_dfs(bytes(data)):
                    sums[lexeme[0]] = sums.get(lexeme[0], 0) + df
            cursor.execute("INSERT INTO fulltext_prefixes (knowledge_base_id, segment_id, prefix, df)"
                           " SELECT %s, %s, p, d FROM unnest(%s::text[], %s::int[]) AS r(p, d)",
                           [kb_id, segment_id, list(sums), list(sums.values())])


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0008_fulltext_segments'),
    ]

    operations = [
        migrations.RunSQL(STORAGE_SQL, "DROP TABLE fulltext_prefixes"),
        migrations.RunSQL(KB_STATS_DROPPED_SQL, KB_STATS_DROPPED_V2_SQL),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
