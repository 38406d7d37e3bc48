"""仓库旁边的 ../shared/data：真实第三方样例与 cmrc2018，只作为额外一层测试。

用户克隆仓库时没有它；依赖它的测试模块在导入时以一行说明整体跳过，绝不失败。CI 把它检出在仓库旁边照常运行。
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

SHARED_DATA = Path(settings.BASE_DIR).parent / "shared" / "data"
FIXTURES = SHARED_DATA / "fixtures"
CMRC2018 = SHARED_DATA / "cmrc2018"


def skip_without_shared_data(path: Path) -> None:
    """在模块顶层调用：``path`` 不存在就跳过整个模块（一行说明）。"""
    if not path.is_dir():
        pytest.skip(f"{path} is absent: ../shared/data is an extra layer of third-party data that CI checks out "
                    "beside the repository", allow_module_level=True)
