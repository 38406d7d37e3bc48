#!/usr/bin/env bash
# 准备运行环境（被 quickstart.sh 与 test.sh 复用，可重复执行）：
# 找到 Python 3.11，创建 .venv，pyproject.toml 变化时重新安装依赖。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

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

# 系统依赖：tesseract OCR（含简体中文模型）；chromium 与 chromium-driver 供检索调试页的端到端测试。缺了也能运行（OCR 回退到 rapidocr 或跳过），
# 但测试与完整功能需要它；只有 root 才自动安装
APT_PACKAGES=(tesseract-ocr tesseract-ocr-chi-sim chromium chromium-driver)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "[bootstrap] apt-get install ${missing[*]}" >&2
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >&2
    else
        echo "[bootstrap] 警告：缺少系统包 ${missing[*]}（请用 apt-get 安装）" >&2
    fi
fi

if [[ ! -x .venv/bin/python ]]; then
    PYTHON="$(find_python)"
    echo "[bootstrap] 创建虚拟环境 .venv（$PYTHON）" >&2
    "$PYTHON" -m venv .venv
fi

# 依赖声明的指纹：变了才重新安装，重复运行只需零点几秒
STAMP=.venv/.ragservice-deps
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]]; then
    echo "[bootstrap] 安装依赖（pip install -e '.[dev]'）" >&2
    .venv/bin/python -m pip install --quiet --upgrade pip >&2
    # torch 固定为 CPU 版本（见 pyproject.toml），pip 会优先使用本机 wheel
    .venv/bin/python -m pip install --quiet -e ".[dev]" >&2
    echo "$WANT" > "$STAMP"
fi
