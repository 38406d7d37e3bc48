"""相关概率模型记下拟合做法的版本（整个模型一份）：一种方式也没学出的库也认得出做法变了。已有的为 0，
定时检查把它们列为待重新拟合（旧模型照用到重新拟合完）。"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('search', '0017_relevance_document_chunk_count'),
    ]

    operations = [
        migrations.AddField(
            model_name='relevanceprofile',
            name='revision',
            field=models.PositiveIntegerField(default=0, verbose_name='拟合做法的版本'),
        ),
    ]
