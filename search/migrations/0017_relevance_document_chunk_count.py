"""相关概率模型记下拟合时文档表上的分块数（含父块）：定时检查拿现在的同一个和与它比（见 ``search.relevance.profiles_due``）。
已有的模型为空：它们的拟合做法版本也旧（``search.0018``），定时检查会重新拟合、补上。"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0016_fulltext_forward_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='relevanceprofile',
            name='document_chunk_count',
            field=models.BigIntegerField(blank=True, null=True, verbose_name='拟合时文档表上的分块数（含父块）'),
        ),
    ]
