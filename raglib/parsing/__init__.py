"""文档解析层：把上传的文件变成按文档顺序排列的 Markdown 片段（需要时 OCR）。

支持 PDF、DOCX、XLSX、XLS、CSV、PPTX、TXT、Markdown、HTML 与 PNG/JPG 图片（另有 EPUB、Outlook .msg）。
- 格式按扩展名与内容双重判定（``detect_format``），改了扩展名的二进制会被识破；
- PDF 每页、表格每个工作表、演示文稿每张幻灯片各一个片段，并记录位置；CSV 每组若干行一个片段，每组都带表头行；
- 图片文件、DOCX/PPTX/XLSX 内嵌图片、没有文字层的 PDF 页面经 OCR 取字（``ocr`` 模块）；
- 损坏、加密、空文件抛 ``ParseError``（``permanent`` 表示重试无用）。

重量级依赖（markitdown、pdfminer、OCR 模型）都在第一次用到时才导入/加载，导入本包很轻。
"""

from raglib.parsing.base import ParsedDocument, ParseError, Segment, UnsupportedFormatError
from raglib.parsing.detect import SUPPORTED_EXTENSIONS, detect_format
from raglib.parsing.ocr import OcrEngine, RapidOcrEngine, TesseractEngine, get_ocr_engine, ocr_available
from raglib.parsing.pipeline import PARSERS, parse_document

__all__ = [
    "PARSERS",
    "SUPPORTED_EXTENSIONS",
    "OcrEngine",
    "ParseError",
    "ParsedDocument",
    "RapidOcrEngine",
    "Segment",
    "TesseractEngine",
    "UnsupportedFormatError",
    "detect_format",
    "get_ocr_engine",
    "ocr_available",
    "parse_document",
]
