"""ragservice：中文优先的 RAG 检索服务。"""
