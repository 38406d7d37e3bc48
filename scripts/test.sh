#!/usr/bin/env bash
# README 的第二条命令：运行全部测试（真实 PostgreSQL + pgvector，默认内嵌服务器），并检查覆盖率。
# 引导时另装测试才需要的系统包（chromium、chromium-driver、fonts-wqy-zenhei），见 bootstrap.sh。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" --test
cd "$ROOT"
exec .venv/bin/python -m pytest --cov --cov-report=term --cov-fail-under=80 "$@"
