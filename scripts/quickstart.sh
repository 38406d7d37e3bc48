#!/usr/bin/env bash
# README 的第一条命令：安装依赖并启动服务（web + worker，默认内嵌 PostgreSQL）。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec .venv/bin/python manage.py serve "$@"
