#!/usr/bin/env bash
# 在 Debian 12 (bookworm) 上准备 PostgreSQL 15 + pgvector 0.8，并启动一个一次性的本地实例。
# 用法：
#   scripts/pg15_pgvector.sh [datadir]        # 安装/构建（幂等）并启动，stdout 最后一行为 RAG_DATABASE_URL=...
#   scripts/pg15_pgvector.sh stop [datadir]   # 停止该数据目录上的服务器
# 环境变量：PG15_PORT（默认 55432）、PG15_BUILD_DIR（私有 apt 状态与源码目录，默认 /var/tmp/pg15_pgvector）
set -euo pipefail

PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG="$PG_BIN/pg_config"
VECTOR_CONTROL=/usr/share/postgresql/15/extension/vector.control
PORT="${PG15_PORT:-55432}"
BUILD_DIR="${PG15_BUILD_DIR:-/var/tmp/pg15_pgvector}"
DB_NAME=ragservice

log() { echo "[pg15_pgvector] $*" >&2; }
die() { log "错误: $*"; exit 1; }

# 以数据目录属主身份运行命令：root 时切换到 postgres 用户（initdb 拒绝以 root 运行）
if [[ $EUID -eq 0 ]]; then
    DB_USER=postgres
    as_owner() { runuser -u "$DB_USER" -- "$@"; }
else
    DB_USER="$(id -un)"
    as_owner() { "$@"; }
fi

# 数据目录统一转成绝对路径（postgres 进程的工作目录不同）
data_dir() { local d="${1:-./var/pg15}"; mkdir -p "$d"; (cd "$d" && pwd -P); }
# 停止时不创建目录，只解析路径
data_dir_existing() { local d="${1:-./var/pg15}"; [[ -d "$d" ]] && (cd "$d" && pwd -P) || echo "$d"; }

# ---------- stop 子命令 ----------
if [[ "${1:-}" == "stop" ]]; then
    DATA="$(data_dir_existing "${2:-}")"
    if [[ -f "$DATA/postmaster.pid" ]] && as_owner "$PG_BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_owner "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
    else
        log "$DATA 上没有运行中的服务器"
    fi
    exit 0
fi

[[ $EUID -eq 0 ]] || die "需要 root 权限（apt-get 安装与构建）"
export DEBIAN_FRONTEND=noninteractive

# ---------- 1. 安装 PostgreSQL 15 与构建工具（已安装则跳过） ----------
PKGS=(postgresql-15 postgresql-server-dev-15 build-essential dpkg-dev ca-certificates)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "安装: ${missing[*]}"
    apt-get update >&2
    apt-get install -y --no-install-recommends "${missing[@]}" >&2
else
    log "PostgreSQL 15 及构建工具已安装，跳过"
fi

# ---------- 2. 从 Debian trixie 的源码包构建 pgvector 0.8（已是 0.8 则跳过） ----------
control_version() { sed -n "s/^default_version *= *'\([^']*\)'.*/\1/p" "$1" 2>/dev/null | head -n1; }

# 从系统 apt 配置中找出正在使用的 Debian 镜像（支持单行 .list 与 deb822 .sources）
find_mirror() {
    local files=() f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] && files+=("$f")
    done
    ((${#files[@]})) || return 0
    grep -hE '^[[:space:]]*(deb(-src)?[[:space:]]|URIs:)' "${files[@]}" \
        | sed -E 's/\[[^]]*\]//g' | grep -oE 'https?://[^[:space:]]+' \
        | sed 's:/*$::' | grep -E '/debian$' | head -n1
}

if [[ "$(control_version "$VECTOR_CONTROL")" == 0.8* ]]; then
    log "pgvector $(control_version "$VECTOR_CONTROL") 已安装，跳过构建"
else
    MIRROR="$(find_mirror || true)"
    MIRROR="${MIRROR:-http://deb.debian.org/debian}"
    log "使用镜像 $MIRROR（trixie deb-src，私有 apt 状态: $BUILD_DIR/apt）"
    APT_DIR="$BUILD_DIR/apt"
    rm -rf "$BUILD_DIR/src"
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$BUILD_DIR/src"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" \
        > "$APT_DIR/sources.list"
    # 私有 apt 状态：不修改系统的 sources.list、lists 与缓存
    APT_OPTS=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
              -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root)
    apt-get "${APT_OPTS[@]}" update >&2
    (cd "$BUILD_DIR/src" && apt-get "${APT_OPTS[@]}" source pgvector >&2)
    SRC="$(find "$BUILD_DIR/src" -mindepth 1 -maxdepth 1 -type d -name 'pgvector-*' | head -n1)"
    [[ -n "$SRC" ]] || die "apt-get source pgvector 未得到源码目录"
    built="$(control_version "$SRC/vector.control")"
    [[ "$built" == 0.8* ]] || die "trixie 源码中的 pgvector 版本为 '$built'，不是 0.8.x"
    log "构建 pgvector $built（$SRC）"
    MAKE_ARGS=(OPTFLAGS="" with_llvm=no PG_CONFIG="$PG_CONFIG")
    make -C "$SRC" -j"$(nproc)" "${MAKE_ARGS[@]}" >&2
    make -C "$SRC" "${MAKE_ARGS[@]}" install >&2
    [[ "$(control_version "$VECTOR_CONTROL")" == 0.8* ]] || die "安装后 $VECTOR_CONTROL 不是 0.8.x"
fi

# ---------- 3. 启动一次性 PostgreSQL 15 集群 ----------
DATA="$(data_dir "${1:-}")"
chown "$DB_USER" "$DATA" 2>/dev/null || true
chmod 700 "$DATA"
as_owner test -w "$DATA" || die "$DB_USER 无法访问 $DATA（检查上级目录权限）"

if [[ ! -f "$DATA/PG_VERSION" ]]; then
    log "initdb -> $DATA"
    as_owner "$PG_BIN/initdb" -D "$DATA" -U "$DB_USER" --auth=trust -E UTF8 --locale=C.UTF-8 >&2
    # 只监听 127.0.0.1，unix socket 放在数据目录内
    cat >> "$DATA/postgresql.conf" <<EOF
# --- scripts/pg15_pgvector.sh ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DATA'
EOF
fi

if as_owner "$PG_BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    # 已在运行：复用，并从 postmaster.pid 第 4 行读取实际端口
    PORT="$(sed -n 4p "$DATA/postmaster.pid")"
    log "复用已运行的服务器（端口 $PORT）"
else
    log "启动服务器（127.0.0.1:$PORT）"
    as_owner "$PG_BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 -o "-p $PORT" start >&2 \
        || { tail -n 20 "$DATA/server.log" >&2; die "服务器启动失败"; }
fi

psql_q() { "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -qtA -h 127.0.0.1 -p "$PORT" -U "$DB_USER" "$@"; }
if [[ "$(psql_q -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
    psql_q -d postgres -c "CREATE DATABASE $DB_NAME" >&2
fi
psql_q -d "$DB_NAME" -c "CREATE EXTENSION IF NOT EXISTS vector" >&2
VECTOR_VERSION="$(psql_q -d "$DB_NAME" -c "SELECT extversion FROM pg_extension WHERE extname = 'vector'")"
SERVER_VERSION="$(psql_q -d "$DB_NAME" -c "SHOW server_version")"
[[ "$VECTOR_VERSION" == 0.8* ]] || die "vector 扩展版本为 '$VECTOR_VERSION'，不是 0.8.x"
# 顺便验证向量运算可用
psql_q -d "$DB_NAME" -c "SELECT '[1,2,3]'::vector <-> '[1,2,4]'::vector" >/dev/null

# ---------- 4. 输出（stdout 可被 eval；最后一行是连接串） ----------
printf 'PG_SERVER_VERSION=%q\n' "$SERVER_VERSION"
printf 'PGVECTOR_VERSION=%q\n' "$VECTOR_VERSION"
echo "RAG_DATABASE_URL=postgresql://$DB_USER@127.0.0.1:$PORT/$DB_NAME"
