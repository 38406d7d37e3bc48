"""一次解析内的 OCR 调度：过滤不值得识别的图片、同图去重、记账（用了哪个引擎、识别了几张、是否跳过）。

各格式的解析器只管“这里有一张图”，是否识别、识别失败怎么办都在这里统一决定：
- 太小（任一边 < 32 像素）或几乎纯色的图是装饰（线条、图标、底纹），不算图片内容，也不识别；
- 有值得识别的图但没有引擎 → ``skipped = True``，文字部分照常返回；
- 引擎运行时抛异常 → 记警告、计入 ``failures``，这一张当作没识别出文字，整个文档继续；
- 像素超过 ``limits.max_image_pixels`` 的内嵌图片不解码（解压炸弹），计入 ``oversized`` 后跳过，
  并在 ``notes`` 里写明是哪张图、多少像素、上限多少——文档照常完成，但维护者要知道这张图的文字没有收进来。
"""

from __future__ import annotations

# PIL 在函数里导入：只有遇到图片时才需要。
import hashlib
import io
from dataclasses import dataclass, field
from typing import Any

import structlog

from raglib.parsing.limits import ParseLimits
from raglib.parsing.ocr import OcrEngine

logger = structlog.get_logger(__name__)

# 任一边小于该像素数的图片不识别（图标、项目符号、分隔线）
MIN_IMAGE_SIDE = 32
# 灰度极差小于该值视为纯色/近纯色图（底纹、色块），其中不可能有可读文字
MIN_CONTRAST = 24


def _is_decorative(picture: Any) -> bool:
    """小图或近纯色图：不含可读文字。"""
    width, height = picture.size
    if min(width, height) < MIN_IMAGE_SIDE:
        return True
    thumbnail = picture.convert("L")
    thumbnail.thumbnail((256, 256))
    low, high = thumbnail.getextrema()
    return bool(high - low < MIN_CONTRAST)


@dataclass
class OcrSession:
    """一个文档解析过程中的 OCR 状态。"""

    engine: OcrEngine | None
    limits: ParseLimits = field(default_factory=ParseLimits)
    images: int = 0
    oversized: int = 0
    failures: int = 0
    skipped: bool = False
    attempted: bool = False
    notes: list[str] = field(default_factory=list)
    _cache: dict[str, str] = field(default_factory=dict)

    @property
    def engine_used(self) -> str | None:
        """真正调用过的引擎名；没有图需要识别（或没有引擎）时为 None。"""
        return self.engine.name if self.engine is not None and self.attempted else None

    def oversized_image(self, data: bytes, *, where: str) -> str | None:
        """像素超限时返回写给维护者的说明，否则 None。只读文件头，不解码像素。"""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as picture:
                width, height = picture.size
        except Image.DecompressionBombError:
            # Pillow 自己的解压炸弹保护（默认约 1.79 亿像素）在 open 时就抛出，拿不到尺寸；
            # 解析子进程里关掉了它，由下面的检查给出准确尺寸
            pillow_limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
            return self.limits.pixels_message(f"{where} has more than {pillow_limit / 1e6:.0f} M pixels")
        except (UnidentifiedImageError, OSError, ValueError):
            return None
        if width * height <= self.limits.max_image_pixels:
            return None
        return self.limits.pixels_message(f"{where} is {width}x{height} = {width * height / 1e6:.0f} M pixels")

    def recognize_bytes(self, data: bytes, *, where: str) -> str:
        """识别一张图片（文件字节）；不值得识别、过大、无引擎或失败时返回空串。"""
        from PIL import Image, UnidentifiedImageError

        too_large = self.oversized_image(data, where=where)
        if too_large is not None:
            self.oversized += 1
            self.notes.append(f"{too_large}; the picture was skipped and its text is not indexed")
            logger.warning("ocr_image_too_large", where=where, error=too_large)
            return ""
        try:
            with Image.open(io.BytesIO(data)) as picture:
                picture.load()
                decorative = _is_decorative(picture)
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            # EMF/WMF/SVG 等 PIL 读不了的矢量图、损坏的图片：跳过，不影响其余内容
            logger.info("ocr_image_unreadable", where=where, error=str(exc))
            return ""
        if decorative:
            return ""
        return self._run(data, where=where)

    def recognize_picture(self, picture: Any, *, where: str) -> str:
        """识别一张已解码的 PIL 图像（PDF 页面渲染图、页面局部裁图）。"""
        if _is_decorative(picture):
            return ""
        if self.engine is None:
            self.skipped = True
            return ""
        buffer = io.BytesIO()
        # 压缩级别 1：几乎不耗时，引擎那边反正要再解码
        picture.save(buffer, format="PNG", compress_level=1)
        return self._run(buffer.getvalue(), where=where)

    def note_unrecognized(self) -> None:
        """调用方确认有图片内容、但无法交给引擎（例如 PDF 渲染库缺失）时记为跳过。"""
        self.skipped = True

    def _run(self, data: bytes, *, where: str) -> str:
        if self.engine is None:
            self.skipped = True
            return ""
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._cache:
            return self._cache[digest]
        self.attempted = True
        try:
            text = self.engine.recognize(data).strip()
        except Exception as exc:  # 引擎内部错误类型各异（onnxruntime、子进程超时……），统一降级
            self.failures += 1
            logger.warning("ocr_failed", engine=self.engine.name, where=where, error=repr(exc))
            return ""
        self.images += 1
        self._cache[digest] = text
        return text
