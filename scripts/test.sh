#!/usr/bin/env bash
# README 的第二条命令：运行全部测试（真实 PostgreSQL + pgvector，默认内嵌服务器），并检查覆盖率。
#   bash scripts/test.sh --fast   快速一层：跳过标记为 slow / process / browser 的测试（不查覆盖率），改代码时用；
#                                 CI 与不带参数的运行照常跑全部测试。
# 引导时另装测试才需要的系统包（chromium、chromium-driver、fonts-wqy-zenhei），见 bootstrap.sh。
# 按 CPU 数并行（pytest-xdist，每个 worker 一个测试库，共用同一个 PostgreSQL 服务器；RAG_TEST_WORKERS=N 指定个数，
# 0 时串行）。
# 标了 serial 的测试（schemathesis：按操作展开的测试共用一个节点 id，xdist 分发不了）在一个进程里另跑
# （RAG_TEST_ROUND 分开两轮，见 tests/conftest.py），覆盖率两轮合并后再检查。
# 测试的大半时间在等数据库与子进程，2 核机器上两个 worker 比串行快约 1.4 倍。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" --test
cd "$ROOT"
# 默认按 CPU 数、至多 4 个：每个 worker 连同检索线程池要占十来个数据库连接，PostgreSQL 默认上限 100
CPUS="$(nproc 2>/dev/null || echo 2)"
WORKERS="${RAG_TEST_WORKERS:-$((CPUS < 4 ? CPUS : 4))}"
if [[ "${1:-}" == "--fast" ]]; then
    shift
    # 快速一层里没有 serial 的测试（schemathesis 都标了 slow）
    RAG_TEST_ROUND=parallel exec .venv/bin/python -m pytest -n "$WORKERS" --dist worksteal \
        -m "not slow and not process and not browser" "$@"
fi
# 只跑一部分测试时，其中一轮可能一个测试都没有（退出码 5：没有收集到测试），不算失败
ok_or_empty() { [[ $1 -eq 0 || $1 -eq 5 ]]; }
# serial 的一轮与并行的一轮同时跑：各用自己的测试库（xdist 的库名带 _gw 后缀）与覆盖率数据文件，输出另存，
# 两轮都结束后打印、合并覆盖率再检查（serial 一轮单进程要两分多钟，排在后面时另一个核一直空着）
SERIAL_LOG="$(mktemp)"
trap 'rm -f "$SERIAL_LOG" .coverage.serial' EXIT
RAG_TEST_ROUND=serial COVERAGE_FILE=.coverage.serial .venv/bin/python -m pytest -p no:xdist --cov --cov-report= "$@" \
    > "$SERIAL_LOG" 2>&1 &
SERIAL_PID=$!
rc=0
RAG_TEST_ROUND=parallel .venv/bin/python -m pytest -n "$WORKERS" --dist worksteal --cov --cov-report= "$@" || rc=$?
serial_rc=0
wait "$SERIAL_PID" || serial_rc=$?
echo "== serial（schemathesis，单进程）=="
cat "$SERIAL_LOG"
ok_or_empty "$rc" || exit "$rc"
ok_or_empty "$serial_rc" || exit "$serial_rc"
[[ -f .coverage.serial ]] && .venv/bin/coverage combine --append -q .coverage.serial
.venv/bin/coverage report --fail-under=80
