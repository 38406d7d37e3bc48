#!/usr/bin/env bash
# README 的第二条命令：运行全部测试（真实 PostgreSQL + pgvector，默认内嵌服务器），并检查覆盖率。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec .venv/bin/python -m pytest --cov --cov-report=term --cov-fail-under=80 "$@"
