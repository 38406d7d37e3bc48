#!/usr/bin/env bash
# 在 127.0.0.1 上启动一个给 ragservice 用的 Redis（Debian 的 redis-server），数据目录在 var/redis/ 下。
#
#   bash scripts/redis.sh            启动（已在运行则什么都不做），打印要设置的 RAG_REDIS_URL
#   bash scripts/redis.sh stop       停止（SHUTDOWN，按配置先落盘）
#   bash scripts/redis.sh status     是否在运行
#
# 端口取 RAG_REDIS_PORT（默认 6379）。缺少 redis-server 时，root 用 apt-get 安装，否则提示后退出。
# 这只是单机/开发用的实例；生产请用托管 Redis 或自己的高可用部署，把地址写进 RAG_REDIS_URL。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${RAG_REDIS_PORT:-6379}"
DIR="$ROOT/var/redis"
PIDFILE="$DIR/redis-$PORT.pid"
URL="redis://127.0.0.1:$PORT/0"

running() {
    [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

case "${1:-start}" in
    stop)
        if running; then
            redis-cli -h 127.0.0.1 -p "$PORT" shutdown >/dev/null
            echo "[redis] 已停止（端口 $PORT）"
        else
            echo "[redis] 没有在运行（端口 $PORT）"
        fi
        exit 0
        ;;
    status)
        if running; then echo "[redis] 运行中：$URL（pid $(cat "$PIDFILE")）"; else echo "[redis] 没有在运行"; exit 1; fi
        exit 0
        ;;
    start) ;;
    *)
        echo "用法：bash scripts/redis.sh [start|stop|status]" >&2
        exit 2
        ;;
esac

if ! command -v redis-server >/dev/null 2>&1; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "[redis] 安装 redis-server（apt-get）…" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    else
        echo "[redis] 缺少 redis-server：请用 apt-get install redis-server 安装" >&2
        exit 1
    fi
fi

mkdir -p "$DIR"
if running; then
    echo "[redis] 已在运行：export RAG_REDIS_URL=$URL"
    exit 0
fi
# 只监听回环地址；AOF 每秒落盘：队列里的任务在 Redis 重启后还在（丢失最多 1 秒）
redis-server --bind 127.0.0.1 --port "$PORT" --dir "$DIR" --daemonize yes --pidfile "$PIDFILE" \
    --logfile "$DIR/redis-$PORT.log" --appendonly yes --appendfsync everysec --save "" \
    --protected-mode yes
for _ in $(seq 50); do
    if redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then
        echo "[redis] 已启动：export RAG_REDIS_URL=$URL"
        exit 0
    fi
    sleep 0.1
done
echo "[redis] 启动失败，见 $DIR/redis-$PORT.log" >&2
tail -n 20 "$DIR/redis-$PORT.log" >&2 || true
exit 1
