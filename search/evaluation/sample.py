"""``manage.py evaluate --sample`` 用的示例数据集：十几段中文、几个问题与标注，由代码生成，不依赖任何外部数据。

给第一次用的人看评测报告长什么样（随包的 embedding 模型一分钟内跑完），也是自己准备数据集时的格式样板：
生成的文件与真实 BEIR 数据集一样（``corpus.jsonl``、``queries.jsonl``、``qrels.tsv``，以及文档级的
``documents.jsonl`` 与 ``qrels_doc.tsv``），由 :func:`raglib.evaluation.dataset.load_dataset` 照常读取。

问题刻意不照抄原文（“个头最大的行星” 对 “体积最大的行星”），并放了同一话题下的干扰段落（月季、兰花、多肉），
这样各检索方式的指标才有高低，不会全是 1.0。数字只是示例，不代表服务的检索质量。
"""

from __future__ import annotations

import json
from pathlib import Path

# (段落 id, 所属文档 id, 标题, 正文)
PASSAGES: tuple[tuple[str, str, str, str], ...] = (
    ("garden-1", "garden", "月季的修剪",
     "月季喜欢阳光充足、排水良好的土壤。早春萌芽前重剪一次，剪掉枯枝、病枝和交叉枝，"
     "每根主枝留三到五个饱满的芽，当年开花更多；花后及时剪去残花。"),
    ("garden-2", "garden", "兰花的光照",
     "兰花怕强光直射，夏天要遮阴，放在明亮的散射光下最好。"
     "叶片发黄、出现灼伤斑多半是晒多了，叶色深绿而不开花则是光照不够。"),
    ("garden-3", "garden", "多肉的浇水",
     "多肉植物耐旱怕涝，盆土完全干透再浇，春秋生长季大约两周浇一次，"
     "夏季休眠期少浇甚至断水，浇水时避开叶心，以免积水烂心。"),
    ("tender-1", "tender", "投标人资格要求",
     "投标人须具有独立法人资格，具备信息系统集成资质，近三年内没有重大违法记录，"
     "并提供类似项目的业绩证明。本项目不接受联合体投标。"),
    ("tender-2", "tender", "评标办法",
     "评标采用综合评分法，满分一百分：技术部分六十分，价格部分四十分。"
     "评标委员会按得分由高到低推荐中标候选人，得分相同的按报价由低到高排序。"),
    ("tender-3", "tender", "投标保证金",
     "投标保证金为人民币五万元，须在投标截止时间前从投标人基本账户转出；未中标的投标人，"
     "保证金在中标通知书发出后五个工作日内退还。"),
    ("space-1", "space", "木星",
     "木星是太阳系中体积和质量都最大的行星，主要由氢和氦组成。"
     "它表面的大红斑是一个持续了几百年的巨型风暴，比地球还大。"),
    ("space-2", "space", "月相",
     "月亮本身不发光，我们看到的是它反射的太阳光。随着月亮绕地球公转，被照亮的部分时多时少，"
     "形成新月、上弦月、满月和下弦月，一个周期大约二十九天半。"),
    ("python-1", "python", "全局解释器锁",
     "CPython 的全局解释器锁（GIL）保证同一时刻只有一个线程执行 Python 字节码，"
     "所以计算密集的多线程程序跑不满多核 CPU，这时应改用多进程。"),
    ("python-2", "python", "虚拟环境",
     "用 python -m venv .venv 创建虚拟环境，"
     "每个项目的依赖装在自己的目录里，互不干扰；激活后 pip 安装的包只进入这个环境。"),
    ("health-1", "health", "睡眠时间",
     "成年人每晚需要七到九小时睡眠。长期睡眠不足会让注意力下降、免疫力变差，"
     "睡前一小时少看手机，有助于更快入睡。"),
    ("travel-1", "travel", "高铁退票",
     "火车票在开车前八天以上退票不收退票费；开车前四十八小时到八天之间退票收百分之五，"
     "二十四到四十八小时之间收百分之十，不足二十四小时收百分之二十。"),
)

# (问题 id, 问题, 相关段落 id, 标准答案)
QUERIES: tuple[tuple[str, str, str, str], ...] = (
    ("q01", "月季一般在什么时候修剪？", "garden-1", "早春"),
    ("q02", "兰花能放在太阳底下直晒吗？", "garden-2", "散射光"),
    ("q03", "多肉植物多久浇一次水？", "garden-3", "两周"),
    ("q04", "参加投标需要什么资质？", "tender-1", "信息系统集成资质"),
    ("q05", "这个项目用什么方法评标？", "tender-2", "综合评分法"),
    ("q06", "没中标的话保证金什么时候退？", "tender-3", "五个工作日"),
    ("q07", "太阳系里个头最大的行星是哪一颗？", "space-1", "木星"),
    ("q08", "为什么 Python 多线程用不满多核？", "python-1", "全局解释器锁"),
    ("q09", "大人每天睡几个小时合适？", "health-1", "七到九小时"),
    ("q10", "提前十天退高铁票要手续费吗？", "travel-1", "不收退票费"),
)

DOCUMENT_TITLES = {"garden": "家庭园艺", "tender": "政务云招标文件", "space": "天文常识", "python": "Python 笔记",
                   "health": "健康常识", "travel": "出行须知"}


def _jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def _qrels(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, c in pairs), encoding="utf-8")


def write_sample_dataset(directory: Path) -> Path:
    """把示例数据集写进 ``directory``（不存在则创建）并返回它；段落级与文档级的文件都写。"""
    directory.mkdir(parents=True, exist_ok=True)
    _jsonl(directory / "corpus.jsonl", [{"_id": pid, "doc_id": doc, "title": title, "text": text}
                                        for pid, doc, title, text in PASSAGES])
    documents: dict[str, list[str]] = {}
    for _, doc, title, text in PASSAGES:
        documents.setdefault(doc, []).append(f"## {title}\n\n{text}")
    _jsonl(directory / "documents.jsonl", [{"doc_id": doc, "title": DOCUMENT_TITLES[doc], "text": "\n\n".join(parts)}
                                           for doc, parts in documents.items()])
    _jsonl(directory / "queries.jsonl", [{"_id": qid, "text": text, "metadata": {"answers": [{"text": answer}]}}
                                         for qid, text, _, answer in QUERIES])
    doc_of = {pid: doc for pid, doc, _, _ in PASSAGES}
    _qrels(directory / "qrels.tsv", [(qid, pid) for qid, _, pid, _ in QUERIES])
    _qrels(directory / "qrels_doc.tsv", [(qid, doc_of[pid]) for qid, _, pid, _ in QUERIES])
    return directory
