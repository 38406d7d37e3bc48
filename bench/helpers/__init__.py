"""基准脚本自己的辅助模块。bench/ 不导入 tests/ 里的任何东西；测试与基准都要用的生成器放在这里。

- :mod:`bench.helpers.hostile_samples`：恶意与畸形文件的流式生成器
  （``bench/hostile_files.py``、``tests/documents/test_hostile_files.py``）。
- :mod:`bench.helpers.xlmr_models`：随机权重的 XLM-RoBERTa 模型目录
  （``bench/model_latency.py``、``tests/model_fixtures.py`` 的夹具）。
"""
