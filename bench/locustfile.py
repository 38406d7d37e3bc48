"""locust 负载脚本（由 bench/load.py 启动；也可单独用，见 bench/pages/load.md）。

两种用户：

- ``MixedUser``：90% ``POST /search``、10% 上传一篇小文档（``POST /knowledge_bases/{kb_id}/documents``，返回 202，
  摄取在后台 worker 里进行）。
- ``SearchUser``：只检索（测空闲时与摄取期间的检索延迟）。

参数经环境变量传入：``RAG_LOAD_KB``（知识库 id，必填）、``RAG_LOAD_QUERIES``（查询文本的 JSON 数组文件，必填）、
``RAG_LOAD_USER_RPS``（每个用户每秒的请求数，默认 1）、``RAG_LOAD_API_KEY``（服务开着鉴权时的 Bearer key）。
目标地址只应是 127.0.0.1 上自己启动的服务。
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from locust import HttpUser, constant_throughput, task

KB = os.environ.get("RAG_LOAD_KB", "")
QUERIES: list[str] = json.loads(Path(os.environ["RAG_LOAD_QUERIES"]).read_text()) if KB else []
USER_RPS = float(os.environ.get("RAG_LOAD_USER_RPS", "1"))
HEADERS = {"Authorization": f"Bearer {os.environ['RAG_LOAD_API_KEY']}"} if os.environ.get("RAG_LOAD_API_KEY") else {}
UPLOAD_NAME = "/knowledge_bases/{kb_id}/documents"


class _RagUser(HttpUser):
    abstract = True
    wait_time = constant_throughput(USER_RPS)

    def search(self) -> None:
        self.client.post("/search", json={"query": random.choice(QUERIES), "knowledge_base_id": KB},
                         headers=HEADERS, name="/search")


class SearchUser(_RagUser):
    @task
    def search_only(self) -> None:
        self.search()


class MixedUser(_RagUser):
    @task(9)
    def search_task(self) -> None:
        self.search()

    @task(1)
    def upload(self) -> None:
        # 一篇约 3 个查询片段拼成的小文档：摄取成本与真实的短文档相当，又不会让队列无限堆积
        text = "\n\n".join(random.sample(QUERIES, 3))
        name = f"load-{random.randrange(10**9)}.txt"
        with self.client.post(f"/knowledge_bases/{KB}/documents", files={"file": (name, text.encode())},
                              headers=HEADERS, name=UPLOAD_NAME, catch_response=True) as response:
            if response.status_code != 202:
                response.failure(f"upload returned {response.status_code}")
