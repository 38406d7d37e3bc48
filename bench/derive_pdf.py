"""从开发集派生“PDF 转出的文本”版本：每篇文档排成两端对齐的 A4 页面，再用服务自己的 PDF 解析器取回文字。

    .venv/bin/python bench/derive_pdf.py ../shared/data/cmrc2018 var/eval-data/cmrc2018_pdf
    .venv/bin/python bench/derive_pdf.py ../shared/data/cmrc2018 var/eval-data/cmrc2018_pdf15 --line-height 7.5

用户的知识库多是 PDF（招标文件、论文、报告），开发集的文本却都来自网页，量不出检索对 PDF 文字层的样子是否敏感：
排版软件在行宽处折行，中文在词中间、英文在词与词之间，pdfminer 逐行取字。这里用 fpdf2 把 ``documents.jsonl`` 的
每篇文档按段落排版（10.5 pt，两端对齐，段落之间留空；行距默认 5.5 mm 即单倍，``--line-height 7.5`` 是标书、公文常见的
1.5 倍行距，那时 pdfminer 让每一行自成一个文字框），全部文档排进同一个 PDF（每篇从新的一页开始，只加载一次字体），
再用 ``raglib.parsing.pdf.parse_pdf`` 逐页取回，一篇文档的各页像摄取流水线那样以空行连接。所以派生出的文本随解析器的
代码而变：改解析器之前、之后各派生一次，评测的就是解析器的改动。

标准答案按派生后的文本重新定位：答案的字之间允许出现空白（折行可能落在答案中间），取离原偏移（按长度比例换算）
最近的那一处，答案文字与 ``doc_start`` 换成派生文本里的样子（answer-hit 按答案逐字出现在分块里判，这样折行本身不会
让它判不中）。找不到的答案原样保留并计数。只派生文档级的文件（documents.jsonl、qrels_doc.tsv、queries.jsonl）。
派生数据只放在本地（var/ 不入库），源数据集的许可同样适用。
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.helpers.beir import copy_files, rewrite_jsonl
from raglib.parsing.ocr_session import OcrSession
from raglib.parsing.pdf import parse_pdf

FONT_CANDIDATES = (Path("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc"),
                   Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"))
FONT_SIZE = 10.5
LINE_HEIGHT_MM = 5.5
PARAGRAPH_GAP_MM = 2.5


def _font() -> Path:
    for candidate in FONT_CANDIDATES:
        if candidate.exists():
            return candidate
    sys.exit("缺少 CJK 字体：apt-get install fonts-wqy-zenhei（scripts/bootstrap.sh --test 会装）")


def render(documents: list[dict[str, Any]], path: Path, line_height: float) -> list[int]:
    """全部文档排进一个 PDF，返回每篇文档的第一页页码（从 1 开始）。"""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_margins(20, 20, 20)
    pdf.set_auto_page_break(auto=True, margin=20)
    pdf.add_font("cjk", fname=str(_font()))
    pdf.set_font("cjk", size=FONT_SIZE)
    first_pages = []
    for document in documents:
        pdf.add_page()
        first_pages.append(pdf.page_no())
        for paragraph in document["text"].split("\n"):
            if paragraph.strip():
                pdf.multi_cell(0, line_height, paragraph.strip(), align="J")
                pdf.ln(PARAGRAPH_GAP_MM)
    pdf.output(str(path))
    return first_pages


def extract(path: Path, first_pages: list[int], total_pages: int) -> list[str]:
    """解析器取回的文字，按文档分开（一篇文档的各页以空行连接，与摄取流水线相同）。"""
    pages: dict[int, str] = {segment.page or 0: segment.text
                             for segment in parse_pdf(path, OcrSession(engine=None))}
    bounds = [*first_pages, total_pages + 1]
    return ["\n\n".join(pages[number] for number in range(start, end) if number in pages)
            for start, end in itertools.pairwise(bounds)]


def relocate(answer: dict[str, Any], old: str, new: str) -> dict[str, Any] | None:
    """答案在派生文本里的位置：字之间允许空白，取离按比例换算的原偏移最近的一处；找不到返回 None。"""
    chars = [re.escape(char) for char in answer["text"] if not char.isspace()]
    if not chars:
        return None
    expected = (answer.get("doc_start") or 0) * len(new) / max(len(old), 1)
    matches = list(re.finditer(r"\s*".join(chars), new))
    if not matches:
        return None
    best = min(matches, key=lambda match: abs(match.start() - expected))
    return {"text": best.group(0), "doc_start": best.start()}


def main(source: Path, target: Path, line_height: float) -> None:
    target.mkdir(parents=True, exist_ok=True)
    documents = [json.loads(line) for line in (source / "documents.jsonl").open(encoding="utf-8") if line.strip()]
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "all.pdf"
        first_pages = render(documents, path, line_height)
        total_pages = _page_count(path)
        texts = extract(path, first_pages, total_pages)
    old_texts = {document["doc_id"]: document["text"] for document in documents}
    new_texts = {document["doc_id"]: text for document, text in zip(documents, texts, strict=True)}
    rewrite_jsonl(source, target, "documents.jsonl", lambda row: {**row, "text": new_texts[row["doc_id"]]})

    counts = {"answers": 0, "moved": 0, "lost": 0}

    def relocate_answers(row: dict[str, Any]) -> dict[str, Any]:
        metadata = row.get("metadata") or {}
        doc_id = metadata.get("doc_id")
        if doc_id not in new_texts:
            return row
        answers = []
        for answer in metadata.get("answers") or ():
            counts["answers"] += 1
            found = relocate(answer, old_texts[doc_id], new_texts[doc_id])
            if found is None:
                counts["lost"] += 1
                answers.append(answer)
            else:
                counts["moved"] += found["text"] != answer["text"]
                answers.append({"text": found["text"], "doc_start": found["doc_start"]})
        return {**row, "metadata": {**metadata, "answers": answers}}

    rewrite_jsonl(source, target, "queries.jsonl", relocate_answers)
    copy_files(source, target, ("qrels_doc.tsv",))
    print(f"wrote {target}: {len(documents)} documents on {total_pages} pages; answers {counts['answers']}, "
          f"spanning a line break {counts['moved']}, not found {counts['lost']}")


def _page_count(path: Path) -> int:
    import pypdfium2

    document = pypdfium2.PdfDocument(str(path))
    try:
        return len(document)
    finally:
        document.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path, help="BEIR 格式的源数据集目录（要有 documents.jsonl）")
    parser.add_argument("target", type=Path, help="输出目录（不存在时创建）")
    parser.add_argument("--line-height", type=float, default=LINE_HEIGHT_MM,
                        help=f"行距（毫米，默认 {LINE_HEIGHT_MM}，即 10.5 磅字的单倍行距）")
    args = parser.parse_args()
    main(args.source, args.target, args.line_height)
