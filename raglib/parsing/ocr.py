"""OCR 引擎：统一的 Protocol + 按名字取用的进程级单例。

- ``rapidocr``：PP-OCR 的 ONNX 模型（随 rapidocr 包分发，含中文模型），中文效果好，CPU 上约 0.5 到 3 秒一张。
- ``tesseract``：系统的 tesseract 程序 + chi_sim 语言包（apt: tesseract-ocr tesseract-ocr-chi-sim），
  作为备选；竖排文字明显弱于 rapidocr。

引擎实例每个进程只建一次（模型几百 MB 内存，不能每个文档加载一遍）；模型在第一次识别时才加载，
所以 web 进程做就绪检查（``ocr_available``）时只做轻量探测，不会把模型读进内存。
"""

from __future__ import annotations

# OCR 引擎（rapidocr + onnxruntime、pytesseract）与 PIL 在函数里导入：很重且可选，只在选用该引擎时加载。
import io
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog

logger = structlog.get_logger(__name__)

ENGINE_CHOICES: tuple[str, ...] = ("auto", "rapidocr", "tesseract", "none")
# 送进引擎前把超大图片缩到这个边长以内：更大对识别没有帮助，只会更慢、更占内存
MAX_IMAGE_SIDE = 4000
# 两个汉字（或汉字与中文标点）之间的空格是 tesseract 的分词假象，去掉
_CJK = r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]"
_SPACE_BETWEEN_CJK = re.compile(rf"(?<={_CJK})\s+(?={_CJK})")


@runtime_checkable
class OcrEngine(Protocol):
    """OCR 引擎：输入图片文件的字节（png/jpg/…），返回识别出的文字，行与行之间用换行分隔。"""

    name: str

    def recognize(self, image: bytes) -> str: ...


def load_image(image: bytes) -> Any:
    """解码成 RGB 的 PIL 图像：按 EXIF 摆正，透明背景铺白（否则透明底黑字会变成全黑），超大图缩小。"""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(image)) as opened:
        picture = ImageOps.exif_transpose(opened)
        picture.load()
    if picture.mode in ("RGBA", "LA", "PA") or (picture.mode == "P" and "transparency" in picture.info):
        rgba = picture.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        picture = background
    elif picture.mode != "RGB":
        picture = picture.convert("RGB")
    if max(picture.size) > MAX_IMAGE_SIDE:
        picture.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
    return picture


class RapidOcrEngine:
    """rapidocr（onnxruntime）引擎。模型在第一次 recognize 时加载，之后复用；加载过程加锁。"""

    name = "rapidocr"

    def __init__(self) -> None:
        self._ocr: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        """轻量探测：能导入 rapidocr 与 onnxruntime，且包内带有检测/识别模型文件（不加载模型）。"""
        try:
            import onnxruntime  # noqa: F401
            import rapidocr
        except Exception:  # 导入失败的原因五花八门（缺包、缺系统库），一律视为不可用
            return False
        models = Path(rapidocr.__file__).resolve().parent / "models"
        names = [path.name for path in models.glob("*.onnx") if path.stat().st_size > 0]
        return any("det" in name for name in names) and any("rec" in name for name in names)

    def load(self) -> Any:
        """加载（只加载一次）并返回 RapidOCR 实例；worker 启动时先调用，免得第一个文档替所有人等。"""
        if self._ocr is None:
            with self._lock:
                if self._ocr is None:
                    from rapidocr import RapidOCR

                    self._ocr = RapidOCR(params={"Global.log_level": "warning"})
        return self._ocr

    def recognize(self, image: bytes) -> str:
        result = self.load()(load_image(image))
        texts = getattr(result, "txts", None) or ()
        return "\n".join(text.strip() for text in texts if text and text.strip())


class TesseractEngine:
    """tesseract 引擎（pytesseract 调用系统程序），语言 chi_sim+eng；丢弃置信度过低的碎词。"""

    name = "tesseract"
    lang = "chi_sim+eng"
    # 低于该置信度的“词”多是版面线条、图标被误识别出的碎片
    min_confidence = 40.0
    timeout_seconds = 120

    @classmethod
    def available(cls) -> bool:
        """探测 tesseract 程序是否存在、且装了 chi_sim 与 eng 语言包。"""
        if shutil.which("tesseract") is None:
            return False
        try:
            import pytesseract

            languages = set(pytesseract.get_languages(config=""))
        except Exception:  # 程序存在但无法运行（损坏、缺动态库）同样视为不可用
            return False
        return {"chi_sim", "eng"} <= languages

    def recognize(self, image: bytes) -> str:
        import pytesseract

        data = pytesseract.image_to_data(
            load_image(image), lang=self.lang, output_type=pytesseract.Output.DICT, timeout=self.timeout_seconds)
        lines: dict[tuple[int, int, int], list[str]] = {}
        for index, word in enumerate(data["text"]):
            word = (word or "").strip()
            if not word or float(data["conf"][index]) < self.min_confidence:
                continue
            key = (data["block_num"][index], data["par_num"][index], data["line_num"][index])
            lines.setdefault(key, []).append(word)
        result = []
        for words in lines.values():
            line = _SPACE_BETWEEN_CJK.sub("", " ".join(words)).strip()
            if line:
                result.append(line)
        return "\n".join(result)


_ENGINE_CLASSES: dict[str, type[RapidOcrEngine] | type[TesseractEngine]] = {
    "rapidocr": RapidOcrEngine,
    "tesseract": TesseractEngine,
}
_instances: dict[str, OcrEngine] = {}
_availability: dict[str, bool] = {}
_warned: set[str] = set()
_registry_lock = threading.Lock()


def _is_available(name: str) -> bool:
    with _registry_lock:
        if name not in _availability:
            _availability[name] = _ENGINE_CLASSES[name].available()
        return _availability[name]


def _instance(name: str) -> OcrEngine:
    with _registry_lock:
        if name not in _instances:
            _instances[name] = _ENGINE_CLASSES[name]()
        return _instances[name]


def ocr_available() -> dict[str, bool]:
    """各引擎是否可用（给就绪报告用；只做轻量探测，结果按进程缓存）。"""
    return {name: _is_available(name) for name in _ENGINE_CLASSES}


def get_ocr_engine(choice: str) -> OcrEngine | None:
    """按配置取 OCR 引擎（进程级单例）。

    ``auto``：rapidocr 可用就用它，否则 tesseract（程序 + chi_sim 都在），都没有返回 None。
    明确指定却不可用的引擎返回 None 并记一次警告；``none`` 直接返回 None。
    """
    if choice not in ENGINE_CHOICES:
        raise ValueError(f"Unknown OCR engine {choice!r}; expected one of {', '.join(ENGINE_CHOICES)}")
    if choice == "none":
        return None
    candidates = list(_ENGINE_CLASSES) if choice == "auto" else [choice]
    for name in candidates:
        if _is_available(name):
            return _instance(name)
    if choice not in _warned:
        _warned.add(choice)
        logger.warning("ocr_engine_unavailable", requested=choice, available=ocr_available(),
                       hint="install rapidocr (pip) or tesseract-ocr + tesseract-ocr-chi-sim (apt)")
    return None


def ocr_warm_up(choice: str) -> str | None:
    """按配置取 OCR 引擎并预先加载其模型，返回引擎名；没有可用引擎返回 None。

    tesseract 是外部程序，没有可预载的东西；rapidocr 的 onnx 模型加载要几秒，放在 worker 启动时做。
    """
    engine = get_ocr_engine(choice)
    if isinstance(engine, RapidOcrEngine):
        engine.load()
    return engine.name if engine is not None else None
