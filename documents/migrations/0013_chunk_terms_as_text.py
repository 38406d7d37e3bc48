"""分块的词位（``search_vector``）改存 tsvector 的规范文本形式，让 PostgreSQL 压缩它。

二进制的 tsvector 开头是每个词位 4 字节的偏移表，pglz（PostgreSQL 默认、内嵌库唯一可用的压缩）在前 1 KB 找不到
重复就放弃，所以这一列一字节也没压过：开发集的长分块每块 3.7~4 KB，是整个数据库里最大的一项。同样的内容写成
文本（``'词位':1A,5B ...``，词位按字节序排好），相邻词位共享前缀、位置串反复出现，pglz 压掉约三成，
读的地方 ``search_vector::tsvector`` 转回来，得到的 tsvector 逐字节相同，排序与分数不变。

``ALTER COLUMN ... TYPE`` 用 ``search_vector::text`` 转换已有的行：锁表、重写整张表、重建它上面的全部索引
（与 0012 一样，大库在维护窗口里做，见 docs/DEPLOYMENT.md），不重新切词、不重新 embedding。依赖
``search.0013``：触发器函数先换成带 ``::tsvector`` 的 v4，再改列。回退把文本转回 tsvector。
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('documents', '0012_embedding_half_precision'),
        ('search', '0013_fulltext_terms_as_text'),
    ]

    operations = [
        migrations.AlterField(
            model_name='documentchunk',
            name='search_vector',
            field=models.TextField(blank=True, null=True, verbose_name='全文索引（tsvector 文本）'),
        ),
    ]
