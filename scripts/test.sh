#!/usr/bin/env bash
# README 的第二条命令：运行全部测试（真实 PostgreSQL + pgvector，默认内嵌服务器），并检查覆盖率。
#   bash scripts/test.sh --fast   快速一层：跳过标记为 slow / process / browser 的测试（不查覆盖率），改代码时用；
#                                 CI 与不带参数的运行照常跑全部测试。
# 引导时另装测试才需要的系统包（chromium、chromium-driver、fonts-wqy-zenhei），见 bootstrap.sh。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" --test
cd "$ROOT"
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec .venv/bin/python -m pytest -m "not slow and not process and not browser" "$@"
fi
exec .venv/bin/python -m pytest --cov --cov-report=term --cov-fail-under=80 "$@"
