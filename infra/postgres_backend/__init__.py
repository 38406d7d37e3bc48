"""项目的 PostgreSQL 数据库后端：django_prometheus 的指标之上，刚刚用过的连接跳过健康检查（见 base.py）。"""
