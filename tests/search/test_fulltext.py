"""中文全文检索构件（jieba 切法）：归一化、切词、tsvector / tsquery 字面量，真实 PostgreSQL 往返，摄取写入与迁移回填。

默认的字 bigram 切法与 BM25 排序见 tests/search/test_bm25.py；这里固定 RAG_FULLTEXT_ANALYZER=jieba，
保证可选的 jieba 切法行为不变。
"""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps as django_apps
from django.db import DataError, connection, transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from documents.models import DocumentChunk
from raglib import analysis, forward
from raglib.analysis import (
    MAX_POSITION,
    MAX_POSITIONS_PER_LEXEME,
    ParsedQuery,
    Word,
    chunk_titles,
    normalize,
    quote_lexeme,
)
from search import segments
from search.chunk_terms import chunk_terms
from tests.documents.test_api import BID_TEXT, upload
from tests.search.oracle import analysed_terms, chunk_vectors, engine_terms, matching_chunks

# 本文件固定 jieba 切法：分析函数直接调用时传它，经服务的路径由 RAG_FULLTEXT_ANALYZER 设为它
ANALYZER = "jieba"


@pytest.fixture(autouse=True)
def jieba_analyzer(settings):
    settings.FULLTEXT_ANALYZER = ANALYZER


def tokenize(text: str) -> list[Word]:
    return analysis.tokenize(text, ANALYZER)


def parse_query(query: str) -> ParsedQuery:
    return analysis.parse_query(query, analyzer=ANALYZER)


def document_tsvector(body: str, titles=()) -> str:
    return analysis.document_tsvector(body, titles, analyzer=ANALYZER)


PROPERTY = hsettings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def fullwidth(text: str) -> str:
    """ASCII → 全角（测试 NFKC；源码里不直接写全角字母，免得与半角混淆）。"""
    return "".join(chr(ord(char) + 0xFEE0) if "!" <= char <= "~" else char for char in text)


def lexemes(text: str) -> list[str]:
    return [word.lexeme for word in tokenize(text)]


def vector_entries(literal: str) -> dict[str, str]:
    """``'词':1A,2B`` → {"词": "1A,2B"}（测试里的词位不含引号）。"""
    return dict(re.findall(r"'([^']*)':(\S+)", literal))


def sql(statement: str, params: list[object]) -> object:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]


def matches(document: str, query: str, titles: tuple[str, ...] = ()) -> bool:
    tsquery = parse_query(query).tsquery
    assert tsquery, query
    return bool(sql("SELECT %s::tsvector @@ %s::tsquery", [document_tsvector(document, titles), tsquery]))


def rank(document: str, query: str, titles: tuple[str, ...] = ()) -> float:
    parsed = parse_query(query)
    return float(sql("SELECT ts_rank_cd(%s::tsvector, %s::tsquery)",  # type: ignore[arg-type]
                     [document_tsvector(document, titles), parsed.rank_tsquery]))


# ---------------------------------------------------------------- 归一化与切词


def test_normalize_width_script_and_case():
    assert normalize("資料庫") == "资料库"
    assert normalize(fullwidth("ABC123")) == "abc123"
    assert normalize("中華人民共和國 " + fullwidth("Hello")) == "中华人民共和国 hello"
    # 快速路径（文本里没有会变的字）与 OpenCC 整段转换结果一致
    assert normalize("一目瞭然，答覆如下") == "一目了然,答复如下"
    assert normalize("简体文本保持不变") == "简体文本保持不变"


def test_tokenize_english_stemming_numbers_and_punctuation():
    assert lexemes("running runs RUN") == ["run", "run", "run"]
    assert lexemes("Machine-Learning, v2.0 版本3.14！") == ["machin", "learn", "v2.0", "版本", "3.14"]
    assert lexemes("…，。！？ —— \\ '") == []
    words = tokenize("什么是中华人民共和国")
    assert [w.lexeme for w in words] == ["什么", "是", "中华人民共和国"]
    assert [w.stop for w in words] == [True, True, False]
    assert {"中华", "人民", "共和国"} <= set(words[2].subwords)


# ---------------------------------------------------------------- tsvector


def test_document_tsvector_weights_positions_and_gaps():
    # 标题在前（A），各部分之间空一个位置，正文（B）接在后面
    # 词位按 UTF-8 字节序（PostgreSQL 的规范顺序）
    assert document_tsvector("中国 run", ["中国"]) == "'run':4B '中国':1A,3B"
    assert document_tsvector("") == "" and document_tsvector("！？", ["。"]) == ""
    # 子词与所在的词同一位置
    entries = vector_entries(document_tsvector("中华人民共和国成立"))
    assert entries["中华人民共和国"] == entries["人民"] == entries["共和国"] == "1B"
    assert entries["成立"] == "2B"


def test_document_tsvector_limits():
    long_text = " ".join(["alpha"] * 400 + [f"w{i}" for i in range(17000)])
    entries = vector_entries(document_tsvector(long_text))
    assert len(entries["alpha"].split(",")) == MAX_POSITIONS_PER_LEXEME
    assert entries["w16999"] == f"{MAX_POSITION}B"


def test_quote_lexeme_escapes():
    assert quote_lexeme("it's") == "'it''s'"
    assert quote_lexeme("a\\b") == "'a\\\\b'"


@pytest.mark.django_db
def test_escaped_lexemes_round_trip_through_postgres():
    quote, backslash, space = quote_lexeme("it's"), quote_lexeme("a\\b"), quote_lexeme("x y")
    literal = f"{quote}:1A {backslash}:2 {space}:3"
    assert sql("SELECT tsvector_to_array(%s::tsvector)", [literal]) == ["a\\b", "it's", "x y"]
    query = f"{quote} & {backslash}"
    assert sql("SELECT %s::tsvector @@ %s::tsquery", [literal, query]) is True


def test_chunk_titles():
    assert chunk_titles("docs/招标文件.v2.pdf", "政务云招标", ["第一章 总则", "1.1 项目概况"]) == [
        "政务云招标", "招标文件.v2", "第一章 总则", "1.1 项目概况"]
    assert chunk_titles("a.md", None, []) == ["a"]
    assert chunk_titles("a.md", "a", "a") == ["a"]  # 去重；字符串形式的标题路径当作一层
    assert chunk_titles("C:\\x\\.env", 2024, [None, " ", "章"]) == [".env", "章"]


# ---------------------------------------------------------------- 查询解析


@pytest.mark.parametrize(("query", "kind", "tsquery"), [
    ("战国无双3是由谁开发的？", "plain", "('战国' | '无双' | '3' | '开发')"),
    ("What is running?", "plain", "'run'"),
    ('"机器学习" 应用 场景', "phrase", "('机器' <-> '学习')"),
    ("「机器学习」「应用场景」", "phrase", "(('机器' <-> '学习') & ('应用' <-> '场景'))"),
    ("“投标截止时间”", "exact", "('投标' <-> '截止' <-> '时间')"),
    ('"Machine Learning"', "exact", "('machin' <-> 'learn')"),
    ("数据库 OR 資料庫 -广告", "boolean", "(('数据库' | '资料库') & !'广告')"),
    ("苹果 | 香蕉", "boolean", "('苹果' | '香蕉')"),
    ('机器 -"深度 学习"', "boolean", "('机器' & !('深度' <-> '学习'))"),
    ("温度 -5度", "plain", "('温度' | '5' | '度')"),  # 后跟数字的 “-” 是负号
    ("OR 数据库 OR", "plain", "('数据库' | '数据' | '据库')"),  # 两侧没有词的 OR 被忽略；长词带上子词
])
def test_query_types(query, kind, tsquery):
    parsed = parse_query(query)
    assert (parsed.type, parsed.tsquery) == (kind, tsquery)


def test_query_details():
    exact = parse_query("  「中华人民共和国 成立」  ")
    assert exact.type == "exact" and exact.phrases == ("中华人民共和国 成立",)
    phrase = parse_query('"机器学习" 应用')
    assert phrase.phrases == () and phrase.rank_tsquery == "(('机器' <-> '学习') | '应用')"
    only_negative = parse_query("-广告 -推广")
    assert only_negative.type == "boolean" and only_negative.tsquery == ""
    assert only_negative.exclude == "('广告' | '推广')"


def test_stopword_only_query_keeps_its_terms():
    assert parse_query("是什么").tsquery == "('是' | '什么')"
    assert parse_query("the who").tsquery == "('the' | 'who')"
    assert parse_query("为什么 是 研究").tsquery == "'研究'"


@pytest.mark.parametrize("query", ["", "   ", "！？。", "😀🎉", '"', '""', "“”", "-", "- -", "OR", "|", "OR | OR",
                                   "\\", "'", "\x00", '"！"'])
def test_nothing_searchable(query):
    parsed = parse_query(query)
    assert parsed.tsquery == "" and parsed.type in ("plain", "boolean")


def test_subword_query_lexemes_are_in_documents():
    document = set(vector_entries(document_tsvector("中华人民共和国成立")))
    assert parse_query("人民").tsquery == "'人民'" and "人民" in document
    # 查询里的长词也会带上子词，两个方向都能匹配
    assert "'人民'" in parse_query("中华人民共和国").tsquery


# ---------------------------------------------------------------- 真实 PostgreSQL 往返


@pytest.mark.django_db
def test_traditional_query_matches_simplified_document():
    assert matches("资料库设计规范与数据备份", "資料庫設計")
    assert matches(fullwidth("Running PostgreSQL"), "postgresql runs")


@pytest.mark.django_db
def test_subword_query_matches_long_word():
    assert matches("中华人民共和国成立于一九四九年", "人民")
    assert matches("中华人民共和国成立于一九四九年", "共和国是什么时候成立的？")
    assert not matches("中华人民共和国成立于一九四九年", "美国")


@pytest.mark.django_db
def test_phrase_needs_adjacent_words():
    near, far = "机器学习在医疗中的应用", "学习如何修理机器"
    assert matches(near, '"机器学习" 医疗') and not matches(far, '"机器学习" 医疗')
    assert matches(far, "机器学习")  # 不加引号是 plain：任一词即可
    # 短语跨越标点仍然相邻，但不会跨越标题与正文的边界
    assert matches("机器，学习", '"机器学习"')
    assert not matches("学习", '"机器学习"', titles=("机器",))


@pytest.mark.django_db
def test_boolean_exclusion_and_alternatives():
    assert matches("数据库设计", "数据库 -广告")
    assert not matches("数据库广告投放", "数据库 -广告")
    assert matches("今天吃香蕉", "苹果 OR 香蕉") and matches("苹果很甜", "苹果 | 香蕉")
    assert not matches("橘子", "苹果 OR 香蕉")
    assert matches("苹果 数据", "苹果 OR 香蕉 数据") and not matches("苹果", "苹果 OR 香蕉 数据")


@pytest.mark.django_db
def test_exact_phrase_with_strpos():
    parsed = parse_query("“投标截止时间”")
    text = "投标截止时间为二〇二四年五月一日。"
    assert matches(text, "“投标截止时间”") and not matches("截止时间之前投标", "“投标截止时间”")
    assert sql("SELECT strpos(lower(%s), lower(%s)) > 0", [text, parsed.phrases[0]]) is True


@pytest.mark.django_db
def test_rank_rewards_coverage_and_titles():
    question = "战国无双3是由谁开发的？"
    full = "《战国无双3》由光荣特库摩旗下的Omega Force开发。"
    partial = "战国时代的历史。"
    assert matches(full, question) and matches(partial, question)
    assert rank(full, question) > rank(partial, question)
    assert rank("正文", "招标", titles=("招标文件",)) > rank("招标 正文", "招标")


# ---------------------------------------------------------------- 属性测试

SYNTAX = st.text(alphabet=list('"“”「」『』-|OR or\\\';:&!()<>*中文机器学习数据库的是ab1 .\x00😀\uff02'), max_size=40)
ANY_QUERY = st.one_of(st.text(max_size=200), SYNTAX,
                      st.lists(st.sampled_from(['"', "OR", "|", "-", "-广告", "“机器", "学习”", "a", "的", "'",
                                                "'; DROP TABLE x; --", "\\", "「", "」"]), max_size=12).map(" ".join))


@pytest.mark.django_db
@PROPERTY
@given(query=ANY_QUERY)
def test_parse_query_always_valid(query):
    """任意字符串都能解析成四种类型之一，且每个 tsquery 字面量 PostgreSQL 都接受。

    见 docs/INVARIANTS.md 的 QUERY-TYPES。
    """
    parsed = parse_query(query)
    assert parsed.type in ("plain", "phrase", "boolean", "exact")
    assert all("\x00" not in phrase for phrase in parsed.phrases)
    if not parsed.tsquery:
        assert not parsed.rank_tsquery
    literals = [literal for literal in (parsed.tsquery, parsed.rank_tsquery, parsed.exclude) if literal]
    if literals:
        with transaction.atomic(), connection.cursor() as cursor:  # 失败时回滚到保存点，不影响后续样例
            cursor.execute("SELECT numnode(q::tsquery) FROM unnest(%s::text[]) AS q", [literals])
            assert all(row[0] > 0 for row in cursor.fetchall())


# 词少、重复多，查询与文档常常命中：必需词的性质才测得到
FEW_WORDS = ["中国", "人民", "国家", "好人", "的", "肝", "run", "running", "x", "3.14"]


@pytest.mark.django_db
@PROPERTY
@given(query=st.lists(st.sampled_from([*FEW_WORDS, '"', "OR", "-", "“", "”"]), min_size=1, max_size=8).map(" ".join),
       bodies=st.lists(st.lists(st.sampled_from(FEW_WORDS), max_size=12).map("".join), min_size=1, max_size=6))
def test_required_terms_are_in_every_match(query, bodies):
    """:attr:`ParsedQuery.required` 里的每个词都在每个满足 tsquery 的分块里（整词，或前缀词开头的某个词位）：
    BM25 据此在回表之前去掉不含它的候选，所以它只能是必要条件。plain 查询没有必需词。"""
    parsed = parse_query(query)
    if parsed.type == "plain" or not parsed.tsquery:
        assert parsed.type != "plain" or parsed.required == ()
        return
    exact = [lexeme for lexeme, prefix in parsed.required if not prefix]
    prefixes = [lexeme for lexeme, prefix in parsed.required if prefix]
    for body in bodies:
        vector = document_tsvector(body)
        with transaction.atomic():
            if not sql("SELECT %s::tsvector @@ %s::tsquery", [vector, parsed.tsquery]):
                continue
            lexemes = set(sql("SELECT array_agg(lexeme) FROM unnest(%s::tsvector)", [vector]) or [])
        assert set(exact) <= lexemes, (query, body)
        for prefix in prefixes:
            assert any(lexeme.startswith(prefix) for lexeme in lexemes), (query, body, prefix)


@pytest.mark.django_db
@PROPERTY
@given(body=st.text(max_size=300), titles=st.lists(st.text(max_size=30), max_size=3))
def test_document_tsvector_always_valid(body, titles):
    """任意文本的 tsvector 字面量 PostgreSQL 都接受，词位数与 Python 侧一致。

    见 docs/INVARIANTS.md 的 QUERY-TYPES。
    """
    literal = document_tsvector(body, titles)
    with transaction.atomic():
        assert sql("SELECT length(%s::tsvector)", [literal]) == len(vector_entries(literal))
        # 字面量就是规范文本（分块存的就是它，documents.0013）
        assert sql("SELECT %s::tsvector::text", [literal]) == literal


def reference_tsvector(body: str, titles, analyzer: str) -> tuple[str, int]:
    """tsvector 的定义照字面写一遍：:func:`analysis.tokenize` 的每个词一个位置（从 1 起，压到 ``MAX_POSITION``），
    子词与所在的词同位，各部分之间空一位，同一位置只记先到的，每个词位至多 ``MAX_POSITIONS_PER_LEXEME`` 个位置。
    摄取用的是不构造 :class:`Word` 的快速写法，两者必须逐字相同（不含 1 MB 上限，样例远小于它）。"""
    entries: dict[str, dict[int, str]] = {}
    position = length = 0
    for text, weight in [*((title, "A") for title in titles), (body, "B")]:
        words = analysis.tokenize(text, analyzer)
        if not words:
            continue
        position += 1 if position else 0
        length += len(words)
        for word in words:
            position += 1
            for lexeme in (word.lexeme, *word.subwords):
                positions = entries.setdefault(lexeme, {})
                if len(positions) < MAX_POSITIONS_PER_LEXEME:
                    positions.setdefault(min(position, MAX_POSITION), weight)
    literal = " ".join(quote_lexeme(lexeme) + ":" + ",".join(f"{at}{weight}" for at, weight in positions.items())
                       for lexeme, positions in sorted(entries.items(), key=lambda item: item[0].encode()))
    return literal, length


# 简繁、汉字串、英文词（含停用词与词干）、数字与小数、引号与反斜杠、标点、汉字零、扩展 B 的字、全角字母
MIXED_ALPHABET = "中国人民共和國的了是在一二abXY run  3.14 '\\，。！〇𠀀Ａ"


@PROPERTY
@pytest.mark.parametrize("analyzer", ["bigram", "jieba", "jieba_bigram"])
@given(body=st.text(alphabet=st.sampled_from(list(MIXED_ALPHABET)), max_size=400),
       titles=st.lists(st.text(max_size=20), max_size=3), repeat=st.integers(0, 300))
def test_document_terms_match_the_tokenize_definition(analyzer, body, titles, repeat):
    """摄取的快速写法与按 tokenize 的定义逐字相同。``repeat`` 把同一个词堆到每词的位置上限；超过 200 时再把位置
    推过 ``MAX_POSITION``，之后的词都压在同一位置上（同一词位在那里只记一次）。"""
    long_body = body + " 中国 x" * repeat + " y" * (MAX_POSITION if repeat > 200 else 0) + " 好人 w 好人 w"
    for text in (body, long_body):
        assert analysis.document_terms(text, titles, analyzer=analyzer) == reference_tsvector(text, titles, analyzer)


@pytest.mark.django_db
@PROPERTY
@given(body=st.text(alphabet=st.sampled_from(list(MIXED_ALPHABET)), max_size=300) | st.text(max_size=300),
       titles=st.lists(st.text(alphabet=st.sampled_from(list(MIXED_ALPHABET)), max_size=20), max_size=2),
       absent=st.lists(st.text(max_size=4), max_size=3), cut=st.integers(1, 3))
def test_forward_terms_match_postgres(body, titles, absent, cut):
    """分块的正排（合并时由 L0 的行编码，``raglib.forward``）解码后找到的（标题，正文）次数与 PostgreSQL 展开
    tsvector 得到的相同：整词与前缀（取各词位的前几个字当前缀），含单引号、反斜杠、扩展 B 的字；不在分块里的词
    不出现。补分数（``search.bm25.chunk_scores``）就是这样取候选的词频。"""
    literal = document_tsvector(body, titles)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT u.lexeme, coalesce(cardinality(array_positions(u.weights, 'A')), 0),"
                       " cardinality(u.weights) FROM unnest(%s::tsvector) u", [literal])
        expected = {lexeme: (title, total - title) for lexeme, title, total in cursor.fetchall()}
        cursor.execute("SELECT lexemes, title_tf, body_tf FROM fulltext_chunk_terms(%s::tsvector)", [literal])
        terms = forward.decode(forward.encode(*cursor.fetchone()))
    assert terms.select([*expected, *absent]) == expected
    prefixes = sorted({lexeme[:cut] for lexeme in expected} | {a for a in absent if a})
    for prefix in prefixes:
        assert terms.select([], [prefix]) == {
            lexeme: counts for lexeme, counts in expected.items() if lexeme.startswith(prefix)}


# ---------------------------------------------------------------- 摄取与迁移回填


@pytest.mark.django_db
def test_ingestion_registers_the_chunk_terms_and_keeps_no_tsvector(client_rw, kb_factory, run_on_commit,
                                                                    fake_embedder):
    """摄取写分块时带上 tsvector（过渡列）：触发器把它登记进引擎（L0 的行）、存下来的这一列是 NULL；登记的词项
    正是按原文重新切出来的，标题部分（文件名、文档标题、标题路径）进入每个分块。"""
    kb = kb_factory()
    response = upload(client_rw, kb, "招标文件.md", BID_TEXT.encode(), run_on_commit,
                      metadata='{"title": "政务云招标"}', chunking='{"chunk_size": 48, "overlap": 8}')
    document_id = response.json()["document_id"]
    chunks = DocumentChunk.objects.filter(document_id=document_id)
    assert chunks.count() > 2 and not chunks.filter(search_vector__isnull=False).exists()
    assert engine_terms(kb.id) == analysed_terms(kb.id)
    index_of = dict(chunks.values_list("id", "chunk_index"))

    def hits(query: str) -> set[int]:
        return {index_of[chunk_id] for chunk_id in matching_chunks(kb.id, parse_query(query).tsquery)}

    deadline = {c.chunk_index for c in chunks if "投标截止时间" in c.chunk_text}
    assert deadline and hits("投標截止時間是什麼時候？") >= deadline
    assert hits('"投标截止时间"') == deadline
    assert hits("招标文件") == hits("政务云") == set(index_of.values())
    assert hits('"技术要求"') == {c.chunk_index for c in chunks if c.metadata["heading_path"] == ["第二章 技术要求"]}


@pytest.mark.django_db
def test_search_vector_is_a_transitional_column(client_rw, kb_factory, run_on_commit, fake_embedder):
    """search_vector 只在写入的语句里出现：给出它的 UPDATE 重新登记分块（撤出旧的、追加新的），存下来仍是 NULL；
    只改别的列的 UPDATE 不碰引擎；改了知识库、文档、角色或词数却不给它的 UPDATE 报错，什么也不改。
    合并后的分块在序号表里留一份正排，比它的 tsvector 文本小得多。"""
    kb = kb_factory()
    document_id = upload(client_rw, kb, "招标文件.md", BID_TEXT.encode(), run_on_commit).json()["document_id"]
    segments.compact(kb.id)
    chunk = DocumentChunk.objects.filter(document_id=document_id).order_by("id").first()
    before = engine_terms(kb.id)
    DocumentChunk.objects.filter(id=chunk.id).update(ann_pending=True)
    assert engine_terms(kb.id) == before and _count("fulltext_deleted", kb) == 0
    vector, length = analysis.document_terms("新的正文：评标办法", analyzer=ANALYZER)
    DocumentChunk.objects.filter(id=chunk.id).update(search_vector=vector, search_length=length)
    assert DocumentChunk.objects.get(id=chunk.id).search_vector is None
    assert _count("fulltext_deleted", kb) == 1 and _count("fulltext_l0", kb) == 1
    assert engine_terms(kb.id)[chunk.id].lexemes == sql("SELECT lexemes FROM fulltext_chunk_terms(%s::tsvector)",
                                                        [vector])
    assert segments.mismatches(kb.id) == []
    with pytest.raises(DataError, match="needs search_vector"), transaction.atomic():
        DocumentChunk.objects.filter(id=chunk.id).update(search_length=length + 1)
    assert DocumentChunk.objects.get(id=chunk.id).search_length == length
    segments.compact(kb.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.chunk_text, c.metadata::text, octet_length(d.terms) FROM fulltext_docs d"
                       " JOIN document_chunks c ON c.id = d.chunk_id WHERE d.knowledge_base_id = %s", [kb.id])
        rows = cursor.fetchall()
    assert rows and all(size < len(chunk_terms(text, meta)[0].encode()) / 2 for text, meta, size in rows)


def _count(table: str, kb) -> int:
    return int(sql(f"SELECT count(*) FROM {table} WHERE knowledge_base_id = %s", [kb.id]))


@pytest.mark.django_db
def test_backfill_reproduces_ingested_vectors(client_rw, kb_factory, run_on_commit, fake_embedder):
    kb = kb_factory()
    upload(client_rw, kb, "招标文件.md", BID_TEXT.encode(), run_on_commit, metadata='{"title": "政务云招标"}')
    DocumentChunk.objects.create(knowledge_base=kb, document_id=DocumentChunk.objects.first().document_id,
                                 chunk_index=999, chunk_text="手工写入的旧分块", metadata={})

    def vectors() -> dict[int, str | None]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, search_vector::text FROM document_chunks")
            return dict(cursor.fetchall())

    def lengths() -> dict[int, int]:
        return dict(DocumentChunk.objects.values_list("id", "search_length"))

    # 分块不再存 tsvector（search.0016）：摄取算出的就是按原文重新切出的；回填那时写的是分块行，这里绕过触发器跑它
    ingested, ingested_lengths = chunk_vectors(kb.id), lengths()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
    # 迁移用自己的冻结切词副本（documents/migrations/_frozen_analysis_0004.py）：当下它与摄取用的 raglib.analysis 一致
    migration = importlib.import_module("documents.migrations.0003_chunk_search_vector")
    with connection.schema_editor() as editor:
        updated = migration.backfill_search_vectors(django_apps, editor, batch_size=2)
    assert updated == len(ingested)
    backfilled = vectors()
    legacy = DocumentChunk.objects.get(chunk_index=999).id
    legacy_vector = sql("SELECT %s::tsvector::text", [document_tsvector("手工写入的旧分块")])
    assert backfilled.pop(legacy) == legacy_vector
    assert backfilled == {k: v for k, v in ingested.items() if k != legacy}  # 与摄取时算出的完全一致
    with connection.schema_editor() as editor:
        assert migration.backfill_search_vectors(django_apps, editor) == 0  # 只处理空值，可重复执行

    # 0004 重算全部分块的 tsvector 与词数：同样与摄取写入的一致
    DocumentChunk.objects.update(search_vector=None, search_length=0)
    recompute = importlib.import_module("documents.migrations.0004_chunk_search_length").recompute
    with connection.schema_editor() as editor:
        assert recompute(django_apps, editor, batch_size=2) == len(ingested)
    recomputed, recomputed_lengths = vectors(), lengths()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = DEFAULT")
    assert recomputed.pop(legacy) == legacy_vector
    assert recomputed_lengths.pop(legacy) == len(tokenize("手工写入的旧分块"))
    ingested.pop(legacy)
    ingested_lengths.pop(legacy)
    assert recomputed == ingested
    assert recomputed_lengths == ingested_lengths
