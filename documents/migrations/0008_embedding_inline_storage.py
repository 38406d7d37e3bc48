"""向量列改为 ``STORAGE MAIN``：尽量留在行内，不挪进 TOAST 表。

384 维 float32 向量 1.5 KB，加上正文与 tsvector，一行常常超过 2 KB；默认的 EXTENDED 让 PostgreSQL 把最大的列
（往往就是压不动的向量）挪进 TOAST，精确扫描与重排每读一行向量就多一次 TOAST 索引查找和一次 TOAST 页读取。
MAIN 让正文、tsvector 先被压缩和挪出，向量只在整行仍然放不下时才挪（1024 维的 4 KB 向量仍会被挪出）。
bench/vector_storage.py 在 1M 行的表里对 1 万分块的知识库精确扫描：缓冲页 41,270 → 2,510，p50/p95
25.8/30.0 → 6.4/10.5 ms（同一次运行，都已用 CTE 里算距离的新写法）。

只改列的属性（瞬间完成），已有的行保持原样、在被重写时才按新方式存放；要让老数据也受益，在维护窗口
``VACUUM FULL document_chunks``（锁表重写）或用 pg_repack 在线重写。
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("documents", "0007_reaper_fast_queue"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE document_chunks ALTER COLUMN embedding SET STORAGE MAIN",
            "ALTER TABLE document_chunks ALTER COLUMN embedding SET STORAGE EXTENDED",
        ),
    ]
