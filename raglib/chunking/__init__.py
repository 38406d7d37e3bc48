"""文档分块：BGE-M3（XLM-R）tokenizer 计数，五种策略（token / semantic / recursive / parent_child / paragraph）。

算法全部是纯函数（不做 I/O、不依赖 Django），见各子模块的说明：

- ``tokenizer``：``Tokenizer.load()`` 加载并缓存 tokenizer，``count``/``offsets`` 只计内容 token；
- ``options``：``ChunkingOptions``（各策略默认值、校验）与结果类型 ``ChunkDraft``；
- ``markdown``：标题层级（ATX/Setext，忽略代码块内的 ``#``）、表格行、代码块识别；
- ``sentences``：引号感知的句子切分；
- ``token_chunker``：按 token 上限与切分点优先级分块，带重叠；
- ``semantic``：语义断崖检测（相邻相似度、百分位阈值、合并）；
- ``recursive``：LangChain 风格的递归字符分块；
- ``paragraphs``：按段落分块（块不跨段落，知识条目的默认）；
- ``core``：入口 ``chunk_text``。
"""

from raglib.chunking.core import chunk_text
from raglib.chunking.markdown import MarkdownLayout, heading_path_at
from raglib.chunking.options import (
    AUTO,
    STRATEGY_DEFAULTS,
    ChunkDraft,
    ChunkingOptions,
    ChunkRole,
    ChunkStrategy,
    EmbedFn,
)
from raglib.chunking.recursive import DEFAULT_SEPARATORS, recursive_split
from raglib.chunking.semantic import adjacent_similarities, cliff_threshold, find_cliffs, merge_into_chunks
from raglib.chunking.sentences import sentence_spans, split_sentences
from raglib.chunking.token_chunker import TokenChunker
from raglib.chunking.tokenizer import Tokenizer, TokenizerLoadError

__all__ = [
    "AUTO",
    "DEFAULT_SEPARATORS",
    "STRATEGY_DEFAULTS",
    "ChunkDraft",
    "ChunkRole",
    "ChunkStrategy",
    "ChunkingOptions",
    "EmbedFn",
    "MarkdownLayout",
    "TokenChunker",
    "Tokenizer",
    "TokenizerLoadError",
    "adjacent_similarities",
    "chunk_text",
    "cliff_threshold",
    "find_cliffs",
    "heading_path_at",
    "merge_into_chunks",
    "recursive_split",
    "sentence_spans",
    "split_sentences",
]
