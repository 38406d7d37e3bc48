"""恶意与畸形文件：每种都走完整的上传 → 摄取，断言终态（failed 且消息点名上限，或 completed）与资源有界。

资源有界的证据是解析子进程的峰值 RSS（父进程用 wait4 取得的 rusage，见 documents.sandbox），
分块阶段在 worker 进程里运行，这里放到子进程里跑同样的 chunk_text 并取它的 rusage。
文件全部在测试里生成（bench/helpers/hostile_samples.py）；embedding 用假的（fake_embedder）。
实测数字与复现方法见 docs/RELIABILITY.md「恶意与畸形文件」。
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
from django_q.models import Schedule

from bench.helpers import hostile_samples
from documents import sandbox
from documents.models import Document, DocumentChunk
from raglib.parsing import ParseError
from raglib.parsing.limits import LimitExceeded, ParseLimits
from tests.documents.test_api import upload
from tests.raglib.test_parsing import make_pdf, pptx_with_claimed_picture

pytestmark = [pytest.mark.process, pytest.mark.django_db]

MB = 1024 * 1024
# 解析子进程的峰值 RSS 上限：实测空载约 95 MB、最坏的嵌套 HTML 约 200 MB（docs/RELIABILITY.md）
PARSE_RSS_CEILING = 400 * MB
# 分块在加载完 tokenizer 之后多占的内存上限：实测 528 万字符单行英文约 +40 MB（改造前 300 万字符就 +440 MB）
CHUNK_EXTRA_RSS = 200 * MB


@pytest.fixture
def sandbox_runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """记录每次解析子进程结束时的日志事件（含 max_rss_mb）。"""
    runs: list[dict[str, Any]] = []
    real = sandbox.logger

    class Recorder:
        def info(self, event: str, **fields: Any) -> None:
            if event == "parse_sandbox_finished":
                runs.append(fields)
            real.info(event, **fields)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    monkeypatch.setattr(sandbox, "logger", Recorder())
    return runs


@pytest.fixture
def ingest(client_rw: Any, kb_factory: Any, run_on_commit: Any, fake_embedder: Any, settings: Any,
           sandbox_runs: list[dict[str, Any]]) -> Any:
    """上传一个文件并同步完成摄取，返回刷新后的 Document；顺带断言解析子进程的 RSS 在上限以内。"""
    settings.OCR_ENGINE = "none"
    kb = kb_factory()

    def run(name: str, content: bytes) -> Document:
        response = upload(client_rw, kb, name, content, run_on_commit)
        assert response.status_code == 202, response.content
        document = Document.objects.get(pk=response.json()["document_id"])
        assert document.status in (Document.Status.COMPLETED, Document.Status.FAILED), document.status
        if not sandbox.parses_in_process(content[:8192], name, len(content)):
            assert sandbox_runs, "parsing did not run in the sandbox"
            assert sandbox_runs[-1]["max_rss_mb"] * MB < PARSE_RSS_CEILING, sandbox_runs[-1]
        return document

    run.kb = kb  # type: ignore[attr-defined]
    return run


def assert_failed(document: Document, *phrases: str) -> None:
    assert document.status == Document.Status.FAILED
    assert document.error_message.startswith("Parsing the file failed: "), document.error_message
    for phrase in phrases:
        assert phrase in document.error_message, document.error_message
    assert document.next_retry_at is None and document.job is not None and document.job.status == "failed"
    assert not DocumentChunk.objects.filter(document=document).exists()


def test_zero_byte_file(ingest):
    assert_failed(ingest("empty.txt", b""), "The file is empty (0 bytes)")


def test_truncated_pdf(ingest):
    whole = make_pdf(["Tender requirements for the data centre", "Second page of terms"])
    document = ingest("cut.pdf", whole[: len(whole) // 2])
    if document.status == Document.Status.FAILED:
        assert_failed(document)
    else:
        # pdfminer 能从截断的 PDF 里按对象扫描恢复出第一页：这也是可接受的终态
        assert DocumentChunk.objects.filter(document=document, chunk_text__contains="Tender").exists()


def test_encrypted_pdf(ingest):
    assert_failed(ingest("secret.pdf", make_pdf(["Confidential"], user="pw")), "encrypted")


def test_pixel_bomb_png_is_reported_as_too_large(ingest, tmp_path):
    path = hostile_samples.pixel_bomb_png(tmp_path / "bomb.png", side=20000)
    document = ingest("bomb.png", path.read_bytes())
    assert_failed(document, "The image is too large", "20000x20000", "RAG_INGEST_MAX_IMAGE_PIXELS")
    assert "OCR found no text" not in document.error_message


def test_zip_bomb_docx_is_rejected_from_the_central_directory(ingest, tmp_path):
    path = hostile_samples.zip_bomb_docx(tmp_path / "bomb.docx", megabytes=150)
    assert path.stat().st_size < 2 * MB
    assert_failed(ingest("bomb.docx", path.read_bytes()), "word/document.xml", "RAG_INGEST_MAX_ARCHIVE_MEMBER",
                  "zip bomb")


def test_zip_bomb_xlsx_is_rejected_from_the_central_directory(ingest, tmp_path):
    path = hostile_samples.zip_bomb_xlsx(tmp_path / "bomb.xlsx", sheets=3, megabytes_per_sheet=40)
    assert_failed(ingest("bomb.xlsx", path.read_bytes()), "RAG_INGEST_MAX_ARCHIVE_RATIO", "zip bomb")


def flate_bomb_pdf(path: Path, *, megabytes: int) -> Path:
    """一页 PDF，内容流是 FlateDecode 压缩的 ``megabytes`` MB 空格：文件约为它的千分之一（流式生成，不占内存）。"""
    compressor = zlib.compressobj(9)
    block = b" " * MB
    stream = b"".join(compressor.compress(block) for _ in range(megabytes)) + compressor.flush()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(stream), stream)]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def assert_not_retried(document: Document) -> None:
    """永久失败只有一次尝试，也没有排下一次（issue #23：解压炸弹曾被当作暂时性失败重试 4 次）。"""
    assert document.attempts == 1
    assert not Schedule.objects.filter(name__startswith="job:").exists()


def test_pdf_flate_bomb_fails_at_once_on_the_stream_limit(ingest, settings, tmp_path):
    """内容流解压后远超上限：解到上限就停（不把整个炸弹解进内存），永久失败并点名上限。"""
    settings.INGEST_MAX_ARCHIVE_MEMBER = 4 * MB
    path = flate_bomb_pdf(tmp_path / "bomb.pdf", megabytes=64)
    assert path.stat().st_size < 100 * 1024
    document = ingest("bomb.pdf", path.read_bytes())
    assert_failed(document, "A compressed stream in the PDF unpacks to more than 4 MB",
                  "RAG_INGEST_MAX_ARCHIVE_MEMBER", "decompression bomb")
    assert_not_retried(document)


def test_pdf_that_exhausts_the_parse_memory_fails_at_once_naming_the_limit(ingest, settings, tmp_path):
    """流上限放开、解析内存上限调低：子进程内存耗尽是永久失败，消息点名 RAG_INGEST_PARSE_MEMORY 与它的值。

    pdf 解析器曾把 MemoryError 翻译成“可重试”的 ParseError，同一个文件按退避重跑、每次都撑满内存。
    """
    settings.INGEST_MAX_ARCHIVE_MEMBER = 4096 * MB
    settings.INGEST_PARSE_MEMORY = 384 * MB
    document = ingest("bomb.pdf", flate_bomb_pdf(tmp_path / "bomb.pdf", megabytes=256).read_bytes())
    assert_failed(document, "RAG_INGEST_PARSE_MEMORY", "384 MB")
    assert "Ran out of memory" not in document.error_message
    assert_not_retried(document)


def test_oversized_picture_in_pptx_leaves_a_note_on_the_document(ingest, client_rw):
    """9 亿像素的内嵌图片被跳过，文档照常完成，error_message 上写明哪张图、多少像素、哪个上限（issue #23）。"""
    document = ingest("deck.pptx", pptx_with_claimed_picture(30000, 30000))
    assert document.status == Document.Status.COMPLETED, document.error_message
    assert DocumentChunk.objects.filter(document=document, chunk_text__contains="评分办法").exists()
    detail = client_rw.get(f"/documents/{document.id}").json()
    assert detail["status"] == "completed"
    note = detail["error_message"]
    assert note.startswith("Completed with notes:"), note
    for phrase in ("slide 2", "30000x30000 = 900 M pixels", "RAG_INGEST_MAX_IMAGE_PIXELS", "skipped"):
        assert phrase in note, note


def test_archive_total_limit(tmp_path):
    """每个成员都不大、压缩比也正常，但总和超限（随机字节几乎不可压缩）。"""
    path = tmp_path / "many.docx"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for number in range(3):
            archive.writestr(f"word/media/image{number}.bin", os.urandom(600 * 1024))
    with pytest.raises(LimitExceeded, match=r"RAG_INGEST_MAX_ARCHIVE_TOTAL"):
        ParseLimits(max_archive_total=MB).check_archive(path)
    ParseLimits().check_archive(path)


def test_thirty_megabyte_one_line_text_fails_on_the_character_limit(ingest, tmp_path):
    path = hostile_samples.one_line_text(tmp_path / "line.txt", megabytes=30)
    assert_failed(ingest("line.txt", path.read_bytes()), "characters of text", "RAG_INGEST_MAX_CHARS")


def test_two_megabytes_of_unpunctuated_chinese_completes(ingest, tmp_path):
    path = hostile_samples.unpunctuated_chinese(tmp_path / "zh.txt", megabytes=2)
    document = ingest("zh.txt", path.read_bytes())
    assert document.status == Document.Status.COMPLETED, document.error_message
    chunks = DocumentChunk.objects.filter(document=document)
    # 没有任何切分点时按 token 窗口硬切：块数与文本长度成正比，每块不超过 512 token
    assert document.chunk_count == chunks.count() > 500
    assert max(chunks.values_list("token_count", flat=True)) <= 512


def test_chunking_pathological_text_stays_in_linear_memory():
    """接近字符上限的单行英文与无标点中文：在子进程里分块，取它自己报告的峰值 RSS（VmHWM）。"""
    script = (
        "import json\n"
        "from raglib.chunking import chunk_text, ChunkingOptions, Tokenizer\n"
        "from documents.sandbox import peak_rss\n"
        "tok = Tokenizer.load(None)\n"
        "english = 'the quick brown fox jumps over the lazy dog ' * 120_000\n"  # 528 万字符、一行
        "chinese = '招标文件投标人资格要求评分办法合同条款技术规格' * 30_000\n"  # 66 万字，无标点
        "result = {'baseline': peak_rss()}\n"
        "for name, text, strategy in (('english', english, 'token'), ('chinese', chinese, 'token'),\n"
        "                             ('chinese_recursive', chinese, 'recursive')):\n"
        "    drafts = chunk_text(text, ChunkingOptions(strategy=strategy), tokenizer=tok)\n"
        "    result[name] = [len(drafts), max(d.token_count for d in drafts), drafts[-1].end == len(text.rstrip())]\n"
        "result['peak'] = peak_rss()\n"
        "print(json.dumps(result))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True,
                               cwd=Path(__file__).resolve().parents[2])
    result = json.loads(completed.stdout)
    assert result["english"][0] > 2500 and result["english"][1] <= 512 and result["english"][2]
    assert result["chinese"][0] > 500 and result["chinese"][1] <= 512 and result["chinese"][2]
    assert result["chinese_recursive"][0] > 500
    # 整篇一次编码时 300 万字符就要多占 440 MB；按窗口编码后分块本身只多占几十 MB
    assert result["peak"] - result["baseline"] < CHUNK_EXTRA_RSS, result


def test_path_traversal_and_control_characters_in_file_names(client_rw, kb_factory, run_on_commit, fake_embedder,
                                                             settings):
    """手写 multipart（测试客户端会先替我们去掉目录部分）：文件名被清理，文件存在本知识库的目录里。"""
    kb = kb_factory()
    names = {
        "../../../etc/passwd.txt": "passwd.txt",
        "..\\..\\windows\\win.ini.txt": "win.ini.txt",
        "evil\x1b[31m\x07name.txt": "evil[31mname.txt",
        "report\u202etxt.md": "reporttxt.md",
    }
    for raw, expected in names.items():
        boundary = "hostileboundary"
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{raw}"\r\n'
                f"Content-Type: text/plain\r\n\r\n招标文件的正文。\r\n--{boundary}--\r\n").encode()
        response = run_on_commit(lambda body=body, boundary=boundary: client_rw.generic(
            "POST", f"/knowledge_bases/{kb.id}/documents", body,
            content_type=f"multipart/form-data; boundary={boundary}"))
        assert response.status_code == 202, response.content
        document = Document.objects.get(pk=response.json()["document_id"])
        assert document.filename == expected
        assert document.status == Document.Status.COMPLETED, document.error_message
        stored = (Path(settings.DATA_DIR) / document.stored_path).resolve()
        assert stored.is_relative_to((Path(settings.DATA_DIR) / "files" / str(kb.id)).resolve())


def test_parse_limits_defaults_match_the_settings():
    """子进程不读 settings：ParseLimits 的默认值（直接调用 parse_document 时使用）与 RAG_INGEST_* 的默认值一致。"""
    assert sandbox.parse_limits() == ParseLimits()


def test_upload_filename_cleaning():
    from documents.uploads import upload_filename
    from infra.errors import ApplicationError

    assert upload_filename("C:\\Users\\x\\..\\招标 文件.pdf") == "招标 文件.pdf"
    assert upload_filename("a\x00b.txt") == "ab.txt"
    long_name = upload_filename("长" * 600 + ".docx")
    assert len(long_name) == 255 and long_name.endswith(".docx")
    with pytest.raises(ApplicationError):
        upload_filename("../\x00/..")


@pytest.mark.parametrize(("encoding", "text"), [
    ("gbk", "第一章 总则\n\n投标人须具备信息系统集成资质，并提供近三年的财务报表。"),
    ("big5", "第一章 總則\n\n投標人須具備資訊系統整合資質，並提供近三年的財務報表。"),
])
def test_gbk_and_big5_text(ingest, encoding, text):
    document = ingest(f"{encoding}.txt", text.encode(encoding))
    assert document.status == Document.Status.COMPLETED, document.error_message
    stored = "".join(DocumentChunk.objects.filter(document=document).values_list("chunk_text", flat=True))
    assert text.split("\n\n")[1] in stored


def test_deeply_nested_html_is_flattened_in_linear_time(ingest, tmp_path):
    path = hostile_samples.nested_html(tmp_path / "deep.html", depth=100_000)
    document = ingest("deep.html", path.read_bytes())
    assert document.status == Document.Status.COMPLETED, document.error_message
    assert DocumentChunk.objects.filter(document=document, chunk_text__contains="嵌套最深处的正文").exists()


def test_memory_ceiling_stops_the_parser_cleanly(tmp_path, sandbox_runs):
    """像素上限放开后解码 4 亿像素的图：子进程撞到 RLIMIT_AS，得到点名 RAG_INGEST_PARSE_MEMORY 的失败。"""
    path = hostile_samples.pixel_bomb_png(tmp_path / "bomb.png", side=20000)
    with pytest.raises(ParseError, match="RAG_INGEST_PARSE_MEMORY") as caught:
        sandbox.parse_isolated(path, filename="bomb.png", ocr=None, limits=ParseLimits(max_image_pixels=10**9),
                               memory_limit=512 * MB, timeout=60)
    assert caught.value.permanent
    assert sandbox_runs[-1]["max_rss_mb"] * MB < 512 * MB


def test_wall_clock_limit_kills_the_parser(tmp_path):
    path = tmp_path / "a.html"
    path.write_text("<html><body><p>正文</p></body></html>")
    with pytest.raises(sandbox.SandboxFailure, match="did not finish within the time limit"):
        sandbox.parse_isolated(path, filename="a.html", ocr=None, limits=ParseLimits(), memory_limit=2 << 30,
                               timeout=0.05)


def test_small_plain_text_parses_in_process_and_large_or_other_formats_in_the_sandbox(tmp_path, sandbox_runs):
    """小的 TXT / Markdown 不起子进程（结果与子进程里的相同），超过 IN_PROCESS_MAX_BYTES 或别的格式照样进子进程。"""
    small = tmp_path / "a.md"
    small.write_text("# 标题\n\n正文，第二句。", encoding="utf-8")
    result = sandbox.parse_isolated(small, filename="a.md", ocr=None, limits=ParseLimits(), memory_limit=2 << 30,
                                    timeout=30)
    assert not sandbox_runs and result.parsed.format == "markdown" and "正文" in result.parsed.segments[0].text
    large = tmp_path / "b.txt"
    large.write_text("正文。" * (sandbox.IN_PROCESS_MAX_BYTES // 9 + 1), encoding="utf-8")
    sandbox.parse_isolated(large, filename="b.txt", ocr=None, limits=ParseLimits(), memory_limit=2 << 30,
                           timeout=60)
    assert len(sandbox_runs) == 1
    assert not sandbox.parses_in_process(b"<html><body>x</body></html>", "c.html", 30)
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)
    assert not sandbox.parses_in_process(png, "d.txt", len(png))  # 名不副实：交给子进程报错
