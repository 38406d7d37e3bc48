"""不依赖 Django 的核心层：模型提供方（embedding、重排序、熔断）、OCR 引擎、文本分析与 BM25、
分块、解析、融合与打分、评测指标。

这一层不导入任何 Django 应用，也不导入 Django 本身：配置以参数或冻结的 dataclass 传入，
因此可以脱离服务单独测试、在子进程（解析沙箱）或基准脚本里直接使用。上面的应用层
（knowledge、documents、search、agents）通过它完成算法部分，自己只管数据库与 HTTP。
"""
