"""WSGI 入口（gunicorn 使用）。"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ragservice.settings")

application = get_wsgi_application()
