#!/usr/bin/env bash
# README 的第一条命令：安装依赖并启动服务（web + worker，默认内嵌 PostgreSQL）。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
# 随包没有训练好的 cross-encoder，离线也下载不到 bge-reranker-v2-m3：演示默认不重排。
# 有模型时设置 RAG_RERANK_PROVIDER=flag RAG_RERANK_MODEL=<hub id 或本地目录>（或 http）。
export RAG_RERANK_PROVIDER="${RAG_RERANK_PROVIDER:-none}"
exec .venv/bin/python manage.py serve "$@"
