"""向量列改存半精度（``halfvec``），索引不变：共享 HNSW 仍是规格要求的 float32 ``vector_cosine_ops``。

向量留在行内（``STORAGE MAIN``，见 0008），一行的大小决定一页放几行：384 维 float32 的行约 2 KB，8 KB 的页只放 4 行；
半精度时约 1.3 KB，放 6 行（每分块的堆 2,048 → 1,368 字节）。1024 维（BGE-M3）的 float32 行约 4.3 KB，一页只放
1 行、一半是空的；半精度时 3 行（8,192 → 2,732 字节）。索引与查询的距离照旧在表达式里 cast 回 ``vector(N)`` 算。

``ALTER COLUMN ... TYPE`` 锁表、重写整张表并重建它上面的全部索引（共享 HNSW 与各知识库自己的索引），不重新
embedding；大库要在维护窗口里做（docs/DEPLOYMENT.md 的“升级”给了耗时）。改类型会把列的存储方式重置成类型的默认值，
所以之后再设一次 ``STORAGE MAIN``；回退时同样。
"""

import pgvector.django.halfvec
from django.db import migrations

INLINE = "ALTER TABLE document_chunks ALTER COLUMN embedding SET STORAGE MAIN"


class Migration(migrations.Migration):

    dependencies = [
        ('documents', '0011_drop_search_vector_gin'),
    ]

    operations = [
        # 回退时最后执行：类型改回 vector 之后重新设 MAIN
        migrations.RunSQL(migrations.RunSQL.noop, INLINE),
        migrations.AlterField(
            model_name='documentchunk',
            name='embedding',
            field=pgvector.django.halfvec.HalfVectorField(blank=True, null=True, verbose_name='向量'),
        ),
        migrations.RunSQL(INLINE, migrations.RunSQL.noop),
    ]
