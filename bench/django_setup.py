"""基准脚本的公共开头：项目根目录放进 sys.path、填默认环境变量、``django.setup()``。

脚本以 ``.venv/bin/python bench/xxx.py`` 运行时 bench/ 在 sys.path 里，所以在导入任何项目模块之前::

    from django_setup import setup_django
    ROOT = setup_django(RAG_QUEUE_SYNC="true")
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django(**defaults: str) -> Path:
    """环境变量只在未设置时取 ``defaults``（命令行上显式给的值优先）；返回项目根目录。"""
    import django

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    for name, value in {"DJANGO_SETTINGS_MODULE": "ragservice.settings", "RAG_LOG_LEVEL": "warning",
                        **defaults}.items():
        os.environ.setdefault(name, value)
    django.setup()
    return ROOT
