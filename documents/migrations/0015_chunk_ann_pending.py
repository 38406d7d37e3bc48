"""分块多一列 ``ann_pending``：有自己的 HNSW 图的知识库，新分块先不进图，检索精确扫描它们，后台任务再插进图里。

已有的行都是假（``DEFAULT false``，加列不重写表），都已在图里。只收为真的行的部分索引几乎是空的，
``CREATE INDEX CONCURRENTLY`` 建它只扫一遍表、不阻塞读写。知识库自己的图的部分条件改成带 ``NOT ann_pending``
的由 ``search.ann.kb_index_build`` 在旁边重建（定时同步，旧图在新图建好之前照常使用）；旧条件的图还在时写入不标记
``ann_pending``（``documents.ingestion``），所以升级中途的任何一刻分块都找得到。

依赖 ``search.0014``：把分块移进图的那条 UPDATE 只改这一列，触发器 v5 才不会把它当成重新索引。
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('documents', '0014_chunk_shared_ann'),
        ('knowledge', '0006_cleanup_jobs'),
        ('search', '0014_fulltext_update_skips_unchanged'),
    ]

    operations = [
        migrations.AddField(
            model_name='documentchunk',
            name='ann_pending',
            field=models.BooleanField(db_default=False, editable=False, verbose_name='暂未进向量图'),
        ),
        AddIndexConcurrently(
            model_name='documentchunk',
            index=models.Index(condition=models.Q(('ann_pending', True)), fields=['knowledge_base'],
                               name='document_chunks_pending_idx'),
        ),
    ]
