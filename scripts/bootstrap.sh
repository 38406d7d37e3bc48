#!/usr/bin/env bash
# 准备运行环境（被 quickstart.sh 与 test.sh 复用，可重复执行）：
# 系统包（缺了才装）→ 找到 Python 3.11 创建 .venv → pyproject.toml 变化时重新安装依赖。
#
#   bash scripts/bootstrap.sh          运行所需：tesseract-ocr tesseract-ocr-chi-sim
#   bash scripts/bootstrap.sh --test   另加测试所需：chromium chromium-driver（无头浏览器测试与截图）、
#                                      fonts-wqy-zenhei（测试生成的图片与截图里的中文）、
#                                      redis-server（2 web + 2 worker 经 Redis 队列的多进程测试）
#
# 每一步只打印一行；apt 与 pip 的完整输出写到 var/log/bootstrap.log，失败时打印其末尾。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

RUN_PACKAGES=(tesseract-ocr tesseract-ocr-chi-sim)
TEST_PACKAGES=(chromium chromium-driver fonts-wqy-zenhei redis-server)
APT_PACKAGES=("${RUN_PACKAGES[@]}")
if [[ "${1:-}" == "--test" ]]; then
    APT_PACKAGES+=("${TEST_PACKAGES[@]}")
fi

mkdir -p var/log
LOG="$ROOT/var/log/bootstrap.log"
: > "$LOG"

# step 说明 命令...：一行进度，输出进日志；失败时给出日志末尾并退出
step() {
    local label="$1" started=$SECONDS
    shift
    printf '[bootstrap] %s … ' "$label" >&2
    if "$@" >>"$LOG" 2>&1; then
        echo "完成（$((SECONDS - started)) 秒）" >&2
    else
        echo "失败，完整输出见 $LOG：" >&2
        tail -n 25 "$LOG" >&2
        exit 1
    fi
}

find_python() {
    local candidate
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "需要 Python 3.11（python3.11 或 python3）" >&2
    return 1
}

apt_install() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

pip_install() {
    .venv/bin/python -m pip install --upgrade pip
    # torch 固定为 CPU 版本（见 pyproject.toml），pip 会优先使用本机 wheel
    .venv/bin/python -m pip install -e ".[dev]"
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
did_something=0
if ((${#missing[@]})); then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        step "安装系统包 ${missing[*]}" apt_install "${missing[@]}"
        did_something=1
    else
        echo "[bootstrap] 警告：缺少系统包 ${missing[*]}（请用 apt-get 安装；只有 root 才会自动安装）" >&2
    fi
fi

if [[ ! -x .venv/bin/python ]]; then
    PYTHON="$(find_python)"
    step "创建虚拟环境 .venv（$PYTHON）" "$PYTHON" -m venv .venv
    did_something=1
fi

# 依赖声明的指纹：变了才重新安装，重复运行只需零点几秒
STAMP=.venv/.ragservice-deps
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]]; then
    step "安装 Python 依赖（pip install -e '.[dev]'，首次约 2 分钟）" pip_install
    echo "$WANT" > "$STAMP"
    did_something=1
fi
if ((did_something == 0)); then
    echo "[bootstrap] 环境已就绪：系统包与 Python 依赖都没有变化" >&2
fi
