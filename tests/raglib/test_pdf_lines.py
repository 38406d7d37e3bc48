"""PDF 文字层的折行：排版软件放不下才折的行接回去，作者的换行保留，行末断词的连字符按整篇文档的用词定夺
（docs/INVARIANTS.md 的 PDF-SOFT-WRAP）。

真实的 PDF 用 fpdf2 在测试里生成（两端对齐的段落、短的标题与列表行）；连字符的几种情形要精确控制每一行的位置，
用与 pdfminer 版面对象同样属性的替身（x0 / x1 / width / height / get_text）直接喂给文字框的拼接。
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from raglib.parsing import parse_document
from raglib.parsing.pdf import _box_text, _resolve_hyphens, _text_lines
from tests.sample_docs import cjk_font

HEADING = "第一章 总则"
ZH_PARAGRAPH = "投标人应当具备承担招标项目的能力，并按招标文件的要求提交投标保证金。" * 4
ZH_LIST = ("一、投标人资格", "二、投标保证金", "三、评标办法")
EN_PARAGRAPH = ("Dense retrieval models encode every document into a vector and rank candidates by similarity; "
                "a hybrid system also keeps a lexical index so that rare identifiers still match exactly. ") * 3


def _pdf(tmp_path: Path, pitch: float) -> Path:
    """12 磅字，行距 ``pitch`` 毫米：6 是单倍行距（pdfminer 把一段的行归进一个文字框），8.5 是标书、公文常见的
    1.5 倍以上行距（每一行自成一个文字框）。段落之间另加 4 毫米段距。"""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.add_font("cjk", fname=str(cjk_font()))
    pdf.set_font("cjk", size=12)
    pdf.add_page()
    for text, align in ((HEADING, "L"), (ZH_PARAGRAPH, "J"), (ZH_PARAGRAPH, "J"), ("\n".join(ZH_LIST), "L"),
                        (EN_PARAGRAPH.strip(), "J")):
        pdf.multi_cell(0, pitch, text, align=align)
        pdf.ln(4)
    path = tmp_path / f"wrapped-{pitch}.pdf"
    pdf.output(str(path))
    return path


@pytest.fixture(scope="module", params=[6.0, 8.5], ids=["single-spaced", "one-and-a-half-spaced"])
def page_text(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = _pdf(tmp_path_factory.mktemp("pdf"), request.param)
    parsed = parse_document(path, filename=path.name, ocr=None)
    assert len(parsed.segments) == 1
    return parsed.segments[0].text


def test_chinese_paragraph_wrapped_by_the_layout_is_one_line_again(page_text: str) -> None:
    # 折行落在“投标保证金”之类的词中间：接回去之后整段逐字还在，短语与精确查询不会因为换行找不到；
    # 两个段落之间有段距，仍是两段
    assert page_text.split("\n\n")[1:3] == [ZH_PARAGRAPH, ZH_PARAGRAPH]


def test_short_lines_written_by_the_author_stay_lines(page_text: str) -> None:
    lines = page_text.splitlines()
    assert HEADING in lines
    assert all(item in lines for item in ZH_LIST)


def test_english_paragraph_is_joined_with_single_spaces(page_text: str) -> None:
    # 两端对齐拉开的词距在文字层里是多个空格；比较时把空白压成一个，整段落在同一行里
    joined = [re.sub(r"\s+", " ", line) for line in page_text.splitlines()]
    assert EN_PARAGRAPH.strip() in joined


def _line(text: str, x0: float, x1: float) -> SimpleNamespace:
    return SimpleNamespace(x0=x0, x1=x1, width=x1 - x0, height=10.0, get_text=lambda: text + "\n")


class _Box(list[SimpleNamespace]):
    """文字框的替身：可迭代出行，带框的左右沿与宽度。"""

    def __init__(self, *lines: SimpleNamespace) -> None:
        super().__init__(lines)
        self.x0 = min(line.x0 for line in lines)
        self.x1 = max(line.x1 for line in lines)
        self.width = self.x1 - self.x0


def _text(box: _Box) -> str:
    return _box_text(box, _text_lines(box))


def test_hyphen_at_the_line_end_is_decided_by_the_rest_of_the_document() -> None:
    box = _Box(_line("Dense models and lexical indexes both need retriev-", 100, 400),
               _line("al evaluation; a conversation-", 100, 399),
               _line("centric design is state-of-the-", 100, 398),
               _line("art and its chat-", 100, 400),
               _line("optimized prompts are short.", 100, 260))
    text = _text(box)
    # 别处写过“conversation-centric”、“optimized”和“chat”各自成词：保留连字符；retrieval 别处连写过：连写；
    # “state-of-the-”本身是复合词：连字符原样保留，不做记号
    resolved, = _resolve_hyphens([text + "\nconversation-centric retrieval; we chat about optimized chats."])
    assert resolved.splitlines()[0] == ("Dense models and lexical indexes both need retrieval evaluation; "
                                        "a conversation-centric design is state-of-the-art and its chat-optimized "
                                        "prompts are short.")


def test_hyphen_without_evidence_is_taken_as_a_broken_word() -> None:
    box = _Box(_line("the design needs con-", 100, 400), _line("firming evidence.", 100, 200))
    resolved, = _resolve_hyphens([_text(box)])
    assert resolved == "the design needs confirming evidence.\n"


def test_a_line_that_ends_early_or_a_narrow_box_keeps_its_line_break() -> None:
    # 行尾离右沿放得下下一行的第一个词：作者的换行
    short = _Box(_line("Results", 100, 140), _line("The engine ranks every query by BM25 and vectors.", 100, 400))
    assert _text(short) == "Results\nThe engine ranks every query by BM25 and vectors.\n"
    # 下一行比多数行缩进：新段落
    indented = _Box(_line("first paragraph ends exactly at the right margin here", 100, 400),
                    _line("Second paragraph starts indented and runs on", 130, 400),
                    _line("to the margin as well.", 100, 220))
    assert _text(indented).splitlines()[0] == "first paragraph ends exactly at the right margin here"
    # 窄框（表格的一列）：宽度就是最长的那一行，分不出是不是折行
    narrow = _Box(_line("Name", 100, 130), _line("Address", 100, 150))
    assert _text(narrow) == "Name\nAddress\n"
