"""管道层（plumbing）：所有应用共用、但不属于任何业务领域的 Django 部件——统一错误契约、RAG_* 配置解析、
请求上下文与日志、指标、数据库路由与后端、advisory lock 与重试、API 的严格序列化器、调用方身份（Principal）、
embedding 提供方的进程级注册表。

它在核心层 ``raglib`` 之上、所有应用之下：可以导入 Django 与 ``raglib``，不导入任何应用
（knowledge、documents、search、ops、agents），也没有模型与迁移。
"""
