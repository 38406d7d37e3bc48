"""检索进程里的段词典缓存：查询在每个段里为每个查询词找词典块，不必每次都查库。

段一经写出就不再修改（合并写新段、删旧段，:mod:`search.segments`），所以它的词典块可以留在进程里。以前每个查询
用一条 SQL 在每个段里为每个查询词做一次索引查找、把块传回来：100k 分块分成 6 个段时每个查询 2~3 ms，是全文一路
最大的一截数据库时间（bench/pages/fulltext_engine.md，“段词典缓存”）。

缓存两样东西，键都是段的代号（``fulltext_segments.generation``，全局序列，整库重建从 0 重新编段号也不会重复，
见 ``search/sql/fulltext_storage.v5.sql``）：

- **段目录**：这个段全部词典块的首词（升序）。查一个词 = 在目录里二分出 ``首词 ≤ 它`` 的最后一块；前缀词再加上首词
  落在它范围里的各块——与原来那条 SQL 选出的块相同。第一次用到一个段时在查询自己的快照里读一次（每块一个首词，
  约是词典大小的 3%），之后一直留着；查询看到的段表里已经没有的段（被并掉了）随下一次读目录清掉。
- **词典块**：块解压后的字节（:func:`raglib.lexicon.unpack_dictionary_block`），按字节数封顶的 LRU
  （``RAG_FULLTEXT_DICTIONARY_CACHE_MB``）。缺的块在查询的快照里按主键一条 SQL 取回。存字节而不是解析好的
  :class:`raglib.lexicon.DictionaryBlock`：解析好的块把词位表切成上百个 bytes 对象、挂在一个列表上，缓存两万块时
  Python 的分代垃圾回收每次都要扫这几百万个引用，100k 库上 p99 从 19 涨到 40~50 ms；解析一块只要几微秒
  （每个查询约 0.3 ms）。

- **词条**：精确查询词在一个段里的词典条目（df 与内联倒排），或“这个段里没有它”，按 (代号, 词位) 记在同一个 LRU 里、
  占同一份字节预算。常见的查询词反复出现，命中时不必找块、解析块再二分（100k 块、1 个段的库上 300 个查询，查词典
  每个查询 92 → 20 µs；段越多省得越多，每个段都要查一遍）。
  条目存成只含字符串、整数与字节的普通元组：CPython 的垃圾回收会把这样的元组移出跟踪，缓存再大也不拖慢回收。
  前缀词一次是一串条目，另记（见下面的“前缀词的条目”）。
- **按首字的 df**：前缀词在一个段里的 df 之和（``fulltext_prefixes``），按 (代号, 前缀) 记在同一个 LRU 里。
- **前缀词的条目**：要读倒排的前缀词在一个段里的全部条目，内联的倒排拼成一段字节（:class:`PrefixEntries`），
  按 (代号, 前缀) 记在同一个 LRU 里：常用字开头的词位有上千个，每次从几十个词典块里找出来、逐个构造条目要几毫秒。
- **段的长度字节**：一个段按序号存的分块长度字节（``fulltext_segments.norms``，一个分块一字节；v7 以前写的段没有，
  它们的块自带），按 (代号,) 记在同一个 LRU、同一份预算里。新写的块不再逐条带长度字节，解码要按序号查它
  （:meth:`SegmentDictionaries.norms`）；100 万块的段 1 MB，第一次用到时读一次。
- **倒排块**：一个词在一个段里已经取过的前几块（块号 0 起连续的一段，压缩的字节），按 (代号, 词位) 记在同一个 LRU、
  同一份预算里。常见词每个查询都要读影响力最高的那几块，命中时这条语句整个省掉（热缓存时每个查询约 0.4 ms）；
  要的块比记着的多时只取后面缺的那几块，接上再记。

另记一样按知识库的：**合并完的库的统计行与段表**（:class:`SettledState`）。上一个查询看到这个库 L0 与删除集都空时
记下分块数、总词数与 (段号, 代号)；下一个普通查询就不开事务、不读统计，直接用它算分，回表那条语句顺带核对它还成立
（见 :mod:`search.bm25` 的 ``_bm25_search``）。不成立就忘掉它、按常规再查一遍。

查询只用自己快照里段表列出的段：合并在查询中途提交，新段的目录要等下一个查询才读，旧段的块还在缓存里，照样读得到。
进程内的线程（检索的线程池）共用一份缓存，读写都在一把锁里（只保护字典操作，不含数据库往返）。
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections import OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from django.conf import settings

from infra.routers import fetchall_prepared
from raglib.lexicon import DictionaryBlock, Entry, unpack_dictionary_block
from raglib.postings import NormLookup, dense_norms

# 前缀词的范围上界：以 p 开头的词位都小于 p + U+10FFFF（与查询一侧的 SQL 同一个约定）
PREFIX_END = "\U0010ffff"

# 一个缓存的词条按这么多字节（加上内联倒排的长度）计入预算：键与值两个元组、词位字符串与 LRU 的链表节点
_ENTRY_BYTES = 200
# 词条缓存里“这个段里没有这个词”的值
_ABSENT = ()

Key = tuple[str, bool]
# 记着合并完状态的知识库至多这么多个（每个几十字节加段表），最久没查的让位
_SETTLED_KBS = 4096


class PrefixEntries(NamedTuple):
    """一个前缀词在一个段里的全部条目（按词位）：内联的倒排首尾相接（``joined``，各条的字节数 ``lengths``），
    其余的条目（倒排在块表里）。"""

    joined: bytes
    lengths: np.ndarray  # int64
    blocked: tuple[Entry, ...]


class StaleSegments(LookupError):
    """要的段已经不在段表里：调用方拿的是快照外记下的段表（合并完的库的 :class:`SettledState`），其间被并掉了。"""


class SegmentNorms(NamedTuple):
    """一个段的序号范围 [first, end) 与按序号的长度字节（v7 以前写的段为 None：块里自带）。"""

    first: int
    end: int
    values: bytes | None


@dataclass(frozen=True)
class SettledState:
    """一个合并完的知识库（L0 与删除集都空）在某个快照里的统计行与段表。"""

    chunk_count: int
    total_length: int
    segments: tuple[tuple[int, int], ...]  # (段号, 代号)，按段号


class SegmentDictionaries:
    """段目录与词典块的缓存；见模块说明。一个进程一份（:data:`DICTIONARIES`）。"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._directories: dict[uuid.UUID, dict[int, list[str]]] = {}  # 知识库 → {代号: 各词典块的首词}
        # (代号, 首词) → 词典块数据；(代号, 词位, 0) → 词条 (df, 内联倒排) 或 _ABSENT；(代号, 前缀, 1) → 按首字
        # 汇总的 df；(代号, 词位, 2) → 这个词块号 0 起的前几个倒排块（bytes 的元组）；(代号, 前缀, 3) → 前缀词的
        # 全部条目（PrefixEntries）。最近用的在后
        self._blocks: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._bytes = 0
        self._settled: OrderedDict[uuid.UUID, SettledState] = OrderedDict()

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def entries(self, cursor: Any, kb_id: uuid.UUID, segments: Sequence[tuple[int, int]],
                keys: Sequence[Key]) -> dict[Key, list[tuple[int, Entry]]]:
        """各段里查询词的词典条目：{(词位, 前缀?): [(段号, 条目)]}，精确词每段至多一个，前缀词是以它开头的全部词位。

        精确词先查词条缓存；没缓存的与前缀词从词典块里找（:meth:`blocks`），找到的与“没有”都记进词条缓存。
        """
        found: dict[Key, list[tuple[int, Entry]]] = {key: [] for key in keys}
        if not keys or not segments:
            return found
        exact = [key for key in keys if not key[1]]
        answered = self._cached_entries(segments, exact)
        for (segment_id, key), entry in answered.items():
            if entry is not None:
                found[key].append((segment_id, entry))
        learned: dict[tuple[int, str], Entry | None] = {}
        for segment_id, block_keys, data in self.blocks(cursor, kb_id, segments, keys, skip=answered):
            block = DictionaryBlock(data)
            for key in block_keys:
                if key[1]:
                    found[key] += [(segment_id, entry) for entry in block.with_prefix(key[0])]
                    continue
                entry = block.find(key[0])
                learned[(segment_id, key[0])] = entry
                if entry is not None:
                    found[key].append((segment_id, entry))
        generations = dict(segments)
        # 没有一块可能含它的精确词（比段里最小的首词还小）也记成“没有”
        self._remember_entries({(generations[segment_id], lexeme): learned.get((segment_id, lexeme))
                                for segment_id, _ in segments for lexeme, _ in exact
                                if (segment_id, (lexeme, False)) not in answered})
        for key in exact:
            found[key].sort(key=lambda pair: pair[0])  # 按段号，与只从块里取时的顺序相同
        return found

    def blocks(self, cursor: Any, kb_id: uuid.UUID, segments: Sequence[tuple[int, int]],
               keys: Sequence[Key], skip: Container[tuple[int, Key]] = ()) -> list[tuple[int, list[Key], bytes]]:
        """各段里服务这些查询词（(词位, 前缀?)）的词典块：[(段号, 它服务的查询词, 块数据)]，按段、块的顺序。

        ``segments`` 是查询快照里的 (段号, 代号)；``cursor`` 在同一个快照里，缺的目录与块从它读。``skip`` 里的
        (段号, 查询词) 不找。
        """
        directories = self._directories_for(cursor, kb_id, segments)
        wanted: dict[tuple[int, int, str], list[Key]] = {}
        for segment_id, generation in segments:
            firsts = directories[generation]
            for key in keys:
                if (segment_id, key) in skip:
                    continue
                lexeme, prefix = key
                at = bisect.bisect_right(firsts, lexeme) - 1  # 首词 ≤ 它的最后一块（-1：比全部首词都小）
                end = bisect.bisect_left(firsts, lexeme + PREFIX_END, lo=max(at, 0)) if prefix else at + 1
                for index in range(max(at, 0), end):
                    wanted.setdefault((segment_id, generation, firsts[index]), []).append(key)
        found = self._cached(wanted)
        missing = [block for block in wanted if block not in found]
        if missing:
            rows = fetchall_prepared(
                cursor.db,
                "SELECT d.segment_id, d.first_lexeme, d.data FROM unnest(%s::int[], %s::text[]) AS k(s, f)"
                " JOIN fulltext_dictionary d ON d.knowledge_base_id = %s::uuid AND d.segment_id = k.s"
                " AND d.first_lexeme = k.f",
                [[block[0] for block in missing], [block[2] for block in missing], kb_id], binary=True)
            generations = dict(segments)
            # 缓存解压后的字节：解压只在取回时做一次（一块约 10 微秒），命中缓存的查询不再付
            fetched = {(int(segment_id), generations[int(segment_id)], first): unpack_dictionary_block(bytes(data))
                       for segment_id, first, data in rows}
            self._remember(fetched)
            found.update(fetched)
        return [(block[0], block_keys, found[block]) for block, block_keys in wanted.items() if block in found]

    def prefix_entries(self, cursor: Any, kb_id: uuid.UUID, segments: Sequence[tuple[int, int]],
                       prefixes: Sequence[str]) -> dict[str, list[tuple[int, PrefixEntries]]]:
        """要读倒排的前缀词在各段里的条目：{前缀: [(段号, PrefixEntries)]}，按段号。

        常用字开头的词位有上千个，散在几十个词典块里：每次从块里找出来、一个个构造条目，一万块的库上一个带前缀词的
        查询要 3~5 ms。段不变，所以按 (代号, 前缀) 把整理好的结果记在同一个 LRU 里：内联的倒排拼成一段字节（解码时
        整段交给 :func:`raglib.postings.decode_joined`），倒排在块表里的少数几个留成条目。缺的照旧从词典块里找。
        """
        keys = {(generation, prefix, 3): (segment_id, prefix) for segment_id, generation in segments
                for prefix in prefixes}
        cached: dict[tuple[Any, ...], Any] = self._hits(list(keys))
        missing = sorted({prefix for key, (_, prefix) in keys.items() if key not in cached})
        if missing:
            found = self.entries(cursor, kb_id, segments, [(prefix, True) for prefix in missing])
            learned: dict[tuple[Any, ...], PrefixEntries] = {}
            for prefix in missing:
                by_segment: dict[int, list[Entry]] = {}
                for segment_id, entry in found[(prefix, True)]:
                    by_segment.setdefault(segment_id, []).append(entry)
                for segment_id, generation in segments:
                    learned[(generation, prefix, 3)] = _prefix_entries(by_segment.get(segment_id, []))
            self._store(learned)
            cached.update(learned)
        result: dict[str, list[tuple[int, PrefixEntries]]] = {prefix: [] for prefix in prefixes}
        for key, (segment_id, prefix) in keys.items():  # 段在外层：每个前缀的列表按段号
            result[prefix].append((segment_id, cached[key]))
        return result

    def prefix_dfs(self, cursor: Any, kb_id: uuid.UUID, segments: Sequence[tuple[int, int]],
                   prefixes: Sequence[str]) -> dict[str, int]:
        """前缀词（孤立的单字）在这些段里的 df 之和：{前缀: df}，df 为 0 的不列。

        段写出时按首字汇总的 df（``fulltext_prefixes``）也随段不变：按 (代号, 前缀) 记在同一个 LRU 里（段里没有的
        记 0），缺的在 ``cursor`` 的快照里一条语句取回。以前每个带前缀词的查询都要单独查一次（约六分之一的查询，
        每次约 0.4 ms）。
        """
        keys = {(generation, prefix, 1): (segment_id, prefix) for segment_id, generation in segments
                for prefix in prefixes}
        cached: dict[tuple[Any, ...], Any] = self._hits(list(keys))
        missing = [key for key in keys if key not in cached]
        if missing:
            generations = dict(segments)
            fetched = {key: 0 for key in missing}
            for segment_id, prefix, df in fetchall_prepared(
                    cursor.db,
                    "SELECT p.segment_id, p.prefix, p.df FROM unnest(%s::int[], %s::text[]) AS k(s, p)"
                    " JOIN fulltext_prefixes p ON p.knowledge_base_id = %s::uuid AND p.segment_id = k.s"
                    " AND p.prefix = k.p",
                    [[keys[key][0] for key in missing], [keys[key][1] for key in missing], kb_id]):
                fetched[(generations[int(segment_id)], prefix, 1)] = int(df)
            self._store(fetched)
            cached.update(fetched)
        totals: dict[str, int] = {}
        for key, (_, prefix) in keys.items():
            totals[prefix] = totals.get(prefix, 0) + int(cached[key])
        return {prefix: df for prefix, df in totals.items() if df > 0}

    def posting_blocks(self, cursor: Any, kb_id: uuid.UUID, segments: Sequence[tuple[int, int]],
                       wanted: Sequence[tuple[int, str, int, int]]) -> list[tuple[int, bytes]]:
        """要读的倒排块：``wanted`` 的每一项 (段号, 词位, 读前几块, 位) 给出这个词在这个段里块号 0 起的前几块，
        按 ``wanted`` 的顺序、块号升序排成 [(位, 块数据)]——与按这个顺序逐项查库的结果相同。

        缓存里记着的不够时，缺的那几块在 ``cursor`` 的快照里一条语句取回（二进制结果格式：bytea 不经十六进制文本），
        接在记着的后面一起记下。``segments`` 是这个快照里的 (段号, 代号)。
        """
        generations = dict(segments)
        keys = {(segment_id, lexeme): (generations[segment_id], lexeme, 2) for segment_id, lexeme, _, _ in wanted}
        cached: dict[tuple[Any, ...], tuple[bytes, ...]] = self._hits(list(keys.values()))
        needed: dict[tuple[int, str], int] = {}
        for segment_id, lexeme, count, _ in wanted:
            if len(cached.get(keys[(segment_id, lexeme)], ())) < count:
                needed[(segment_id, lexeme)] = max(count, needed.get((segment_id, lexeme), 0))
        if needed:
            fetched: dict[tuple[int, str], list[bytes]] = {}
            for segment_id, lexeme, data in fetchall_prepared(
                    cursor.db,
                    "SELECT r.s, r.l, b.data FROM unnest(%s::int[], %s::text[], %s::int[], %s::int[]) AS r(s, l, f, k)"
                    " CROSS JOIN LATERAL (SELECT data, block_no FROM fulltext_blocks b"
                    " WHERE b.knowledge_base_id = %s::uuid AND b.segment_id = r.s AND b.lexeme = r.l"
                    " AND b.block_no >= r.f AND b.block_no < r.k) b ORDER BY r.s, r.l, b.block_no",
                    [[key[0] for key in needed], [key[1] for key in needed],
                     [len(cached.get(keys[key], ())) for key in needed], list(needed.values()), kb_id], binary=True):
                fetched.setdefault((int(segment_id), lexeme), []).append(bytes(data))
            grown = {keys[key]: cached.get(keys[key], ()) + tuple(fetched.get(key, ())) for key in needed}
            self._store(grown)
            cached.update(grown)
        return [(slot, data) for segment_id, lexeme, count, slot in wanted
                for data in cached.get(keys[(segment_id, lexeme)], ())[:count]]

    def norms(self, cursor: Any, kb_id: uuid.UUID, segments: Sequence[tuple[int, int]]) -> NormLookup | None:
        """这些段（快照里的 (段号, 代号)）里分块的长度字节，按序号查（:func:`raglib.postings.dense_norms`）；
        段都是 v7 以前写的（块里自带长度字节）时为 None。缓存里没有的段在 ``cursor`` 上一条语句取回；
        其中有段已经不在时抛 :class:`StaleSegments`（只会发生在快照外记下的段表上）。

        相邻的段序号连成一段（并段只并相邻的），几个段的拼成一个数组；旧段的那一截填 0，它的块不会来查。"""
        keys = {segment_id: (generation, 4) for segment_id, generation in segments}
        cached: dict[tuple[Any, ...], SegmentNorms] = self._hits(list(keys.values()))
        absent = [segment_id for segment_id, key in keys.items() if key not in cached]
        if absent:
            cursor.execute("SELECT segment_id, first_ordinal, end_ordinal, norms FROM fulltext_segments"
                           " WHERE knowledge_base_id = %s AND segment_id = ANY(%s)", [kb_id, absent])
            fetched = {keys[int(segment_id)]: SegmentNorms(int(first), int(end), None if data is None else bytes(data))
                       for segment_id, first, end, data in cursor.fetchall()}
            if len(fetched) < len(absent):
                raise StaleSegments(kb_id)
            self._store(fetched)
            cached.update(fetched)
        parts = sorted((part for part in cached.values() if part.end > part.first), key=lambda part: part.first)
        if all(part.values is None for part in parts):
            return None
        if len(parts) == 1:
            assert parts[0].values is not None
            return dense_norms(parts[0].first, np.frombuffer(parts[0].values, dtype=np.uint8))
        values = np.zeros(parts[-1].end - parts[0].first, dtype=np.uint8)
        for part in parts:
            if part.values is not None:
                values[part.first - parts[0].first:part.end - parts[0].first] = np.frombuffer(part.values, np.uint8)
        return dense_norms(parts[0].first, values)

    def _directories_for(self, cursor: Any, kb_id: uuid.UUID,
                         segments: Sequence[tuple[int, int]]) -> dict[int, list[str]]:
        with self._lock:
            known = dict(self._directories.get(kb_id, {}))
        absent = [segment_id for segment_id, generation in segments if generation not in known]
        if absent:
            cursor.execute("SELECT segment_id, array_agg(first_lexeme ORDER BY first_lexeme) FROM fulltext_dictionary"
                           " WHERE knowledge_base_id = %s AND segment_id = ANY(%s) GROUP BY segment_id",
                           [kb_id, absent])
            loaded = dict(cursor.fetchall())
            generations = dict(segments)
            for segment_id in absent:
                known[generations[segment_id]] = loaded.get(segment_id) or []
            live = {generation for _, generation in segments}
            with self._lock:
                # 只留这个快照里还在的段：被并掉的段不会再被查询引用
                self._directories[kb_id] = {generation: firsts for generation, firsts in known.items()
                                            if generation in live}
        return known

    def _cached_entries(self, segments: Sequence[tuple[int, int]],
                        keys: Sequence[Key]) -> dict[tuple[int, Key], Entry | None]:
        """词条缓存里有的：{(段号, 查询词): 条目，或 None 表示这个段里没有它}。"""
        hits = self._hits([(generation, key[0], 0) for _, generation in segments for key in keys])
        return {(segment_id, key): Entry(key[0], *value) if value is not _ABSENT else None
                for segment_id, generation in segments for key in keys
                if (value := hits.get((generation, key[0], 0))) is not None}

    def _remember_entries(self, learned: dict[tuple[int, str], Entry | None]) -> None:
        self._store({(generation, lexeme, 0): _ABSENT if entry is None else (entry.df, entry.inline)
                     for (generation, lexeme), entry in learned.items()})

    def _cached(self, wanted: dict[tuple[int, int, str], Any]) -> dict[tuple[int, int, str], bytes]:
        hits = self._hits([(block[1], block[2]) for block in wanted])
        return {block: hits[(block[1], block[2])] for block in wanted if (block[1], block[2]) in hits}

    def _hits(self, keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], Any]:
        """LRU 里有的那些键与值；命中的挪到最近用的一端。"""
        hits: dict[tuple[Any, ...], Any] = {}
        with self._lock:
            for key in keys:
                value = self._blocks.get(key)
                if value is not None:
                    self._blocks.move_to_end(key)
                    hits[key] = value
        return hits

    def _remember(self, fetched: dict[tuple[int, int, str], bytes]) -> None:
        self._store({(generation, first): data for (_, generation, first), data in fetched.items()})

    def _store(self, items: dict[tuple[Any, ...], Any]) -> None:
        """放进 LRU（已有的换成新的值：一个词的倒排块前缀会变长；词典块与词条的值不会变），超出预算时从最久没用的
        开始让位；比整个预算还大的不放。"""
        budget = settings.FULLTEXT_DICTIONARY_CACHE_MB * 1024 * 1024
        with self._lock:
            for key, value in items.items():
                size = _size(value)
                if size > budget:
                    continue
                old = self._blocks.pop(key, None)
                if old is not None:
                    self._bytes -= _size(old)
                self._blocks[key] = value
                self._bytes += size
            while self._bytes > budget:
                _, value = self._blocks.popitem(last=False)
                self._bytes -= _size(value)

    def settled(self, kb_id: uuid.UUID) -> SettledState | None:
        """上一个查询记下的这个库合并完的状态；没有记着（或上次看到它有 L0、删除集）时是 None。"""
        with self._lock:
            state = self._settled.get(kb_id)
            if state is not None:
                self._settled.move_to_end(kb_id)
            return state

    def remember_settled(self, kb_id: uuid.UUID, state: SettledState | None) -> None:
        """记下（``state`` 为 None 时忘掉）这个库合并完的状态。"""
        with self._lock:
            if state is None:
                self._settled.pop(kb_id, None)
                return
            self._settled[kb_id] = state
            self._settled.move_to_end(kb_id)
            while len(self._settled) > _SETTLED_KBS:
                self._settled.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._directories.clear()
            self._blocks.clear()
            self._settled.clear()
            self._bytes = 0


def _prefix_entries(entries: Sequence[Entry]) -> PrefixEntries:
    inline = [entry.inline for entry in entries if entry.inline is not None]
    return PrefixEntries(b"".join(inline), np.fromiter(map(len, inline), dtype=np.int64, count=len(inline)),
                         tuple(entry for entry in entries if entry.inline is None))


def _size(value: Any) -> int:
    """缓存里一项计入预算的字节数：词典块是它的数据；词条是固定开销加内联倒排；一串倒排块是固定开销加各块。"""
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, SegmentNorms):
        return _ENTRY_BYTES + len(value.values or b"")
    if isinstance(value, PrefixEntries):
        return _ENTRY_BYTES * (1 + len(value.blocked)) + len(value.joined) + value.lengths.nbytes
    if isinstance(value, int):
        return _ENTRY_BYTES
    if value and isinstance(value[0], bytes):
        return _ENTRY_BYTES + sum(len(block) for block in value)
    return _ENTRY_BYTES + (len(value[1] or b"") if value else 0)


DICTIONARIES = SegmentDictionaries()
