from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """面向 Agent 的接入层：MCP 工具（stdio 与 streamable HTTP 两种传输共用同一组工具）。"""

    name = "agents"
    verbose_name = "Agent 接入"
